// Load: 64 concurrent streaming clients (official openai client) against 4 running slots.
//  bounded: --max-queued 28, so 4 + 28 = 32 may be in flight; the rest must get 429 at once.
//  queued:  --max-queued 256, so all 64 wait their turn and complete.
// Every request must complete or get 429, nothing may hang (per-request deadline), the gateway's
// rejection counter must match the 429s seen, and the mesh must be idle afterwards. Prints p50/p99
// TTFT (first content delta, the seat's definition) and aggregate tokens/s (from usage).
import { assert, assertEq, loadOpenAI, metricsText, metricValue, runCases, startMesh, startRealMesh } from './harness.mjs';

const OpenAI = await loadOpenAI();
const MODEL = 'dsmesh-test';
const LABELS = 'model_name="dsmesh-test",engine="0"';
const CLIENTS = 64;

function pct(sorted, p) {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

async function oneClient(mesh, i) {
  const c = new OpenAI({ baseURL: mesh.url, apiKey: 'x', maxRetries: 0, timeout: 60000 });
  const words = Array.from({ length: 12 }, (_, k) => `c${i}w${k}`).join(' ');
  const t0 = performance.now();
  try {
    const stream = await c.chat.completions.create({ model: MODEL, stream: true, stream_options: { include_usage: true }, temperature: 0,
      chat_template_kwargs: { thinking: false }, messages: [{ role: 'user', content: words }],
      max_tokens: 32, ignore_eos: mesh.real === true });
    let ttft = null, usage = null, finish = null;
    for await (const ch of stream) {
      if (ttft === null && ch.choices.length && ch.choices[0].delta.content) ttft = performance.now() - t0;
      if (ch.choices.length && ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
      if (ch.usage) usage = ch.usage;
    }
    return { ok: true, ttft, tokens: usage.completion_tokens, finish, end: performance.now() };
  } catch (e) {
    if (e.status === 429) return { rejected: true, end: performance.now(), code: e.code };
    return { error: `${e.status ?? ''} ${e.message}` };
  }
}

async function run(mesh, label) {
  const t0 = performance.now();
  const hangGuard = new Promise((_, rej) => setTimeout(() => rej(new Error('load run hung for 60 s')), 60000));
  const results = await Promise.race([Promise.all(Array.from({ length: CLIENTS }, (_, i) => oneClient(mesh, i))), hangGuard]);
  const wall = (performance.now() - t0) / 1000;
  const ok = results.filter((r) => r.ok), rejected = results.filter((r) => r.rejected), errors = results.filter((r) => r.error);
  const ttfts = ok.map((r) => r.ttft).sort((a, b) => a - b);
  const tokens = ok.reduce((s, r) => s + r.tokens, 0);
  console.log(`     ${label}: ${CLIENTS} clients, ${ok.length} completed, ${rejected.length} got 429, ${errors.length} errors; ` +
    `TTFT p50 ${pct(ttfts, 50).toFixed(1)} ms p99 ${pct(ttfts, 99).toFixed(1)} ms; ${tokens} tokens in ${wall.toFixed(2)} s = ${(tokens / wall).toFixed(0)} tok/s`);
  return { ok, rejected, errors, results };
}

async function idle(mesh) {
  const deadline = Date.now() + 5000;
  let m;
  while (Date.now() < deadline) {
    m = await metricsText(mesh.base);
    if (metricValue(m, `vllm:num_requests_running{${LABELS}}`) === 0 && metricValue(m, `vllm:num_requests_waiting{${LABELS}}`) === 0 &&
        metricValue(m, `dsmesh_gateway_requests_in_flight{${LABELS}}`) === 0) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`mesh not idle after the run:\n${m.split('\n').filter((l) => /running|waiting|in_flight/.test(l)).join('\n')}`);
}

const cases = [
  ['64 streaming clients, 4 slots, --max-queued 28: completions or 429, nothing hangs', async ({ bounded }) => {
    const { ok, rejected, errors } = await run(bounded, 'bounded (max-queued 28)');
    assertEq(errors.map((e) => e.error), [], 'no errors');
    assertEq(ok.length + rejected.length, CLIENTS, 'every request completed or was refused');
    assert(rejected.length >= 1, 'some requests over the limit got 429');
    assert(ok.length >= 32, `at least 4 + 28 requests admitted (got ${ok.length})`);
    for (const r of rejected) assertEq(r.code, 'queue_full', '429 code');
    for (const r of ok) assert(r.finish === 'stop' || r.finish === 'length', 'finish_reason of completed requests');
    const m = await idle(bounded);
    assertEq(metricValue(m, `dsmesh_requests_rejected_total{${LABELS},reason="queue_full"}`), rejected.length, 'rejections counted');
  }],
  ['64 streaming clients, 4 slots, --max-queued 256: all complete in turn', async ({ queued }) => {
    const { ok, errors } = await run(queued, 'queued (max-queued 256)');
    assertEq(errors.map((e) => e.error), [], 'no errors');
    assertEq(ok.length, CLIENTS, 'all completed');
    await idle(queued);
    const m = await metricsText(queued.base);
    assert(metricValue(m, `vllm:request_queue_time_seconds_count{${LABELS}}`) >= CLIENTS, 'queue times observed');
  }],
  ['real mesh (coordinator + 2 CPU workers, tiny model), 4 slots, --max-queued 28', async ({ real }) => {
    const { ok, rejected, errors } = await run(real, 'real mesh (max-queued 28)');
    assertEq(errors.map((e) => e.error), [], 'no errors');
    assertEq(ok.length + rejected.length, CLIENTS, 'every request completed or was refused');
    assert(rejected.length >= 1 && ok.length >= 32, `admitted ${ok.length}, refused ${rejected.length}`);
    const m = await idle(real);
    assertEq(metricValue(m, `dsmesh_requests_rejected_total{${LABELS},reason="queue_full"}`), rejected.length, 'rejections counted');
  }],
];

await runCases(cases, {
  setup: async () => ({
    bounded: await startMesh({ slots: 4, stepMs: 20, maxQueued: 28 }),
    queued: await startMesh({ slots: 4, stepMs: 5, maxQueued: 256 }),
    real: await startRealMesh({ maxNumSeqs: 4, maxQueued: 28 }),
  }),
  teardown: async (ctx) => { for (const m of Object.values(ctx)) await m.stop(); },
});

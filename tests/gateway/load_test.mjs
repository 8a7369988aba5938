// Load, asserting only what holds at any machine speed (the figures are `dsmesh bench --url U --clients N`'s
// job, docs/serving-under-load.md): 64 concurrent streaming clients (official openai client) against
// 4 running slots.
//  bounded: --max-queued 28, so 4 + 28 = 32 may be in flight; the rest must get 429 at once.
//  queued:  --max-queued 256, so all 64 wait their turn and complete.
//  real:    the real mesh (coordinator + 2 CPU workers, tiny model), --max-queued 28.
// Every request completes (finish_reason stop/length) or gets 429, nothing hangs (per-request deadline),
// the usage of the completed requests adds up to the gateway's token counters, the 429s to its
// rejection counter, all 4 slots were in use at some point, and the mesh is idle afterwards. Then the
// load benchmark itself runs against the fixture and its counts must agree with what it saw.
import { spawn } from 'node:child_process';
import path from 'node:path';
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
    return { ok: true, ttft, tokens: usage.completion_tokens, promptTokens: usage.prompt_tokens, finish, end: performance.now() };
  } catch (e) {
    if (e.status === 429) return { rejected: true, end: performance.now(), code: e.code };
    return { error: `${e.status ?? ''} ${e.message}` };
  }
}

const counter = (m, name) => metricValue(m, `${name}{${LABELS}}`) ?? 0;

async function run(mesh, label) {
  const t0 = performance.now();
  const before = await metricsText(mesh.base);
  // The most requests seen running at once (sampled while the run lasts: a slow machine only samples more).
  let maxRunning = 0, running = true;
  const sampler = (async () => {
    while (running) {
      maxRunning = Math.max(maxRunning, counter(await metricsText(mesh.base), 'vllm:num_requests_running'));
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  const hangGuard = new Promise((_, rej) => setTimeout(() => rej(new Error('load run hung for 120 s')), 120000));
  let results;
  try {
    results = await Promise.race([Promise.all(Array.from({ length: CLIENTS }, (_, i) => oneClient(mesh, i))), hangGuard]);
  } finally {
    running = false;
    await sampler;
  }
  const wall = (performance.now() - t0) / 1000;
  const ok = results.filter((r) => r.ok), rejected = results.filter((r) => r.rejected), errors = results.filter((r) => r.error);
  const ttfts = ok.map((r) => r.ttft).sort((a, b) => a - b);
  const tokens = ok.reduce((s, r) => s + r.tokens, 0);
  console.log(`     ${label}: ${CLIENTS} clients, ${ok.length} completed, ${rejected.length} got 429, ${errors.length} errors; ` +
    `TTFT p50 ${pct(ttfts, 50).toFixed(1)} ms p99 ${pct(ttfts, 99).toFixed(1)} ms; ${tokens} tokens in ${wall.toFixed(2)} s = ${(tokens / wall).toFixed(0)} tok/s`);
  const after = await idle(mesh);
  assertEq(maxRunning, 4, `${label}: requests running at once at most (all slots used)`);
  assertEq(counter(after, 'vllm:generation_tokens_total') - counter(before, 'vllm:generation_tokens_total'),
           tokens, `${label}: usage.completion_tokens add up to vllm:generation_tokens_total`);
  assertEq(counter(after, 'vllm:prompt_tokens_total') - counter(before, 'vllm:prompt_tokens_total'),
           ok.reduce((s, r) => s + r.promptTokens, 0), `${label}: usage.prompt_tokens add up to vllm:prompt_tokens_total`);
  return { ok, rejected, errors, results, after };
}

async function idle(mesh) {
  const deadline = Date.now() + 30000;  // a deadline, not a measurement: generous for a loaded machine
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
    for (const r of ok) assert(r.tokens >= 1, 'every completed request has output');
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
    for (const r of ok) assertEq(r.tokens, 32, 'ignore_eos: every answer has max_tokens tokens');
  }],
  ['dsmesh bench --url --clients 64 (load mode) against the bounded fixture: its counts agree', async ({ bounded }) => {
    const args = process.argv.slice(2);
    const dsmesh = path.resolve(args[args.indexOf('--dsmesh') + 1]);
    const out = await new Promise((resolve, reject) => {
      const p = spawn(dsmesh, ['bench', '--url', bounded.base, '--clients', '64', '--max-tokens', '16', '--timeout-s', '60'],
        { stdio: ['ignore', 'pipe', 'pipe'] });
      let text = '', err = '';
      p.stdout.on('data', (d) => { text += d; });
      p.stderr.on('data', (d) => { err += d; });
      const timer = setTimeout(() => { p.kill('SIGKILL'); reject(new Error(`bench hung:\n${text}\n${err}`)); }, 90000);
      p.on('exit', (c) => { clearTimeout(timer); c === 0 ? resolve(text) : reject(new Error(`bench exited ${c}:\n${text}\n${err}`)); });
    });
    console.log(out.split('\n').map((l) => `     ${l}`).join('\n'));
    const m = out.match(/completed (\d+), 429 (\d+), errors (\d+) of 64 requests/);
    assert(m, 'summary line');
    const [done, refused, errors] = m.slice(1).map(Number);
    assertEq(errors, 0, 'bench errors');
    assertEq(done + refused, 64, 'completed + 429');
    assert(refused >= 1 && done >= 32, `completed ${done}, refused ${refused}`);
    const c = out.match(/generation tokens \+(\d+) \(usage says (\d+)\), rejected \+(\d+) \(429s seen (\d+)\)/);
    assert(c, 'counter line');
    assertEq(c[1], c[2], 'generation tokens vs usage');
    assertEq(c[3], c[4], 'rejections vs 429s');
    assertEq(Number(c[2]), done * 16, 'ignore_eos: 16 tokens per completed request');
    for (const row of ['TTFT', 'inter-token latency', 'time per output token'])
      assert(new RegExp(`${row}\\s+[\\d.]+\\s+[\\d.]+`).test(out), `${row} p50/p99 printed`);
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

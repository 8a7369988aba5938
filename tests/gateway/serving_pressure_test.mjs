// Serving under pressure on the real mesh (dsmesh up --no-gateway: coordinator + 2 CPU workers, tiny
// model) with three real gateways against the one coordinator:
//  - admission is the coordinator's: 4 slots + --max-queued 2 (given to the coordinator through `up`)
//    are shared by the gateways; requests beyond the bound get 429 queue_full whichever gateway they
//    came through, although no gateway alone holds more than half of the bound. A gateway's own
//    --max-queued (gateway 2: 0) is forwarded and only lowers the bound for its requests.
//  - a client that disconnects frees its slot and KV blocks within one engine step while other streams
//    run (the coordinator's own count, dsmesh_cancel_free_steps_max, and /metrics sampled around it).
//  - /health says why: 503 {"status":"unavailable","reason":...} naming the lost worker and that the
//    mesh is re-forming after a SIGKILLed worker, then 200 {"status":"ok"} once `up` restarted it.
import { assert, assertEq, metricsText, metricValue, runCases, startRealMesh } from './harness.mjs';

const MODEL = 'dsmesh-test';
const LABELS = 'model_name="dsmesh-test",engine="0"';
const SLOTS = 4, QUEUED = 2;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const metric = async (base, name) => metricValue(await metricsText(base), `${name}{${LABELS}}`) ?? 0;

// A streaming chat completion read event by event. Resolves when the answer ends (or is aborted);
// `firstEvents` resolves once `n` content events arrived (the request is past its prefill).
function streamChat(base, { content, maxTokens = 64, n = 3 }) {
  const controller = new AbortController();
  let events = 0, notify = null;
  const firstEvents = new Promise((r) => { notify = r; });
  const done = (async () => {
    let r;
    try {
      r = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST', signal: controller.signal, headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, stream: true, max_tokens: maxTokens, ignore_eos: true, temperature: 0,
                               chat_template_kwargs: { thinking: false }, messages: [{ role: 'user', content }] }),
      });
    } catch (e) {
      return { status: 'aborted' };
    }
    if (r.status !== 200) return { status: r.status, headers: r.headers, body: await r.json() };
    let text = '', finish = null;
    try {
      const dec = new TextDecoder();
      for await (const chunk of r.body) {
        text += dec.decode(chunk, { stream: true });
        events = (text.match(/"content":"[^"]/g) || []).length;
        if (events >= n) notify();
        const m = text.match(/"finish_reason":"(\w+)"/);
        if (m) finish = m[1];
      }
    } catch (e) {
      return { status: 200, aborted: true, text };
    }
    return { status: 200, text, finish, done: text.includes('data: [DONE]') };
  })();
  return { done, firstEvents, abort: () => controller.abort(), events: () => events };
}

async function until(pred, ms, what) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await pred()) return;
    await sleep(20);
  }
  throw new Error(`timed out after ${ms} ms: ${what}`);
}

const words = (tag, k) => Array.from({ length: k }, (_, j) => `${tag}w${j}`).join(' ');

const cases = [
  ['two gateways share the coordinator\'s bound (4 running + 2 queued): the 7th..10th get 429 through either', async ({ mesh }) => {
    const [g0, g1] = mesh.gateways;
    const before = await metricsText(g0.base);
    const rejectedBefore = metricValue(before, `dsmesh_coordinator_requests_rejected_total{${LABELS}}`);
    assertEq(metricValue(before, `dsmesh_coordinator_max_queued{${LABELS}}`), QUEUED, 'the coordinator reports its --max-queued');
    const gwRejected = async (g) => metricValue(await metricsText(g.base), `dsmesh_requests_rejected_total{${LABELS},reason="queue_full"}`);
    const gwBefore = [await gwRejected(g0), await gwRejected(g1)];
    // 3 through each gateway: exactly the bound; no gateway alone is near it.
    const admitted = [];
    for (let k = 0; k < SLOTS + QUEUED; k++)
      admitted.push(streamChat(k % 2 ? g1.base : g0.base, { content: words(`adm${k}`, 8), maxTokens: 96 }));
    await until(async () => (await metric(g0.base, 'vllm:num_requests_running')) === SLOTS &&
                            (await metric(g0.base, 'vllm:num_requests_waiting')) === QUEUED, 30000,
                'coordinator shows 4 running + 2 waiting');
    // Beyond the bound: two more through each gateway, while the six are in flight.
    const t0 = Date.now();
    const over = await Promise.all([g0, g1, g0, g1].map((g, k) =>
      streamChat(g.base, { content: words(`over${k}`, 8), maxTokens: 8 }).done));
    const refusedMs = Date.now() - t0;
    for (const r of over) {
      assertEq(r.status, 429, 'a request beyond the shared bound');
      assertEq(r.body.error.type, 'rate_limit_error', '429 error type');
      assertEq(r.body.error.code, 'queue_full', '429 error code');
      assert(/6 requests running or waiting in the coordinator, limit 4 running \+ 2 queued/.test(r.body.error.message),
             `429 message: ${r.body.error.message}`);
    }
    // The 429 status is the exact check (a request that waited for a slot would get 200); the wall bound only
    // catches a refusal that hung, with room for a loaded 2-core machine.
    assert(refusedMs < 15000, `429s came at once (${refusedMs} ms)`);
    assertEq(await metric(g0.base, 'vllm:num_requests_running') + await metric(g0.base, 'vllm:num_requests_waiting'),
             SLOTS + QUEUED, 'the refused requests never reached the scheduler');
    const results = await Promise.all(admitted.map((s) => s.done));
    for (const r of results) {
      assertEq(r.status, 200, 'an admitted request');
      assert(r.done && r.finish === 'length', `admitted request completed: ${r.finish} ${r.text?.slice(-200)}`);
    }
    const after = await metricsText(g1.base);
    assertEq(metricValue(after, `dsmesh_coordinator_requests_rejected_total{${LABELS}}`) - rejectedBefore, 4,
             'the coordinator counted the 4 refusals');
    assertEq([(await gwRejected(g0)) - gwBefore[0], (await gwRejected(g1)) - gwBefore[1]], [2, 2],
             'each gateway counted its own 429s');
    const again = await streamChat(g1.base, { content: words('again', 4), maxTokens: 4 }).done;
    assertEq(again.status, 200, 'served again once the queue drained');
    console.log(`     4 over the bound refused in ${refusedMs} ms; 6 admitted completed`);
  }],

  ['a gateway\'s own --max-queued 0 is forwarded: its request is refused while another gateway\'s queues', async ({ mesh }) => {
    const [g0, , g2] = mesh.gateways;
    const running = [];
    for (let k = 0; k < SLOTS; k++) running.push(streamChat(g0.base, { content: words(`run${k}`, 8), maxTokens: 64 }));
    await until(async () => (await metric(g0.base, 'vllm:num_requests_running')) === SLOTS, 30000, '4 running');
    const refused = await streamChat(g2.base, { content: words('strict', 4), maxTokens: 4 }).done;
    assertEq(refused.status, 429, 'gateway 2 (--max-queued 0) with every slot taken');
    assert(/limit 4 running \+ 0 queued/.test(refused.body.error.message), refused.body.error.message);
    const queued = await streamChat(g0.base, { content: words('lenient', 4), maxTokens: 4 }).done;
    assertEq(queued.status, 200, 'gateway 0 (the coordinator\'s bound) queues instead');
    for (const r of await Promise.all(running.map((s) => s.done))) assertEq(r.finish, 'length', 'running request finished');
  }],

  ['a client disconnect under load frees its slot and KV blocks within one step', async ({ mesh }) => {
    const [g0, g1] = mesh.gateways;
    const base = g0.base;
    const freedBefore = await metric(base, 'dsmesh_cancelled_requests_freed_total');
    // 4 streams with long prompts (~ 400 tokens, 25+ KV blocks each), through both gateways.
    const streams = [0, 1, 2, 3].map((k) =>
      streamChat(k % 2 ? g1.base : g0.base, { content: words(`kv${k}`, 130), maxTokens: 2000, n: 3 }));
    await Promise.all(streams.map((s) => s.firstEvents));
    await until(async () => (await metric(base, 'vllm:num_requests_running')) === SLOTS, 10000, '4 running');
    const m0 = await metricsText(base);
    const steps0 = metricValue(m0, `dsmesh_engine_steps_total{${LABELS}}`);
    const kv0 = metricValue(m0, `vllm:kv_cache_usage_perc{${LABELS}}`);
    const t0 = Date.now();
    streams[0].abort();
    let m1;
    await until(async () => {
      m1 = await metricsText(base);
      return metricValue(m1, `vllm:num_requests_running{${LABELS}}`) === SLOTS - 1;
    }, 5000, 'the disconnected request left the running set');
    const ms = Date.now() - t0;
    const steps1 = metricValue(m1, `dsmesh_engine_steps_total{${LABELS}}`);
    const kv1 = metricValue(m1, `vllm:kv_cache_usage_perc{${LABELS}}`);
    console.log(`     disconnect: running 4 -> 3 after ${ms} ms and ${steps1 - steps0} engine step(s) completed; ` +
                `kv usage ${kv0.toFixed(4)} -> ${kv1.toFixed(4)}; cancel_free_steps_max ` +
                `${metricValue(m1, `dsmesh_cancel_free_steps_max{${LABELS}}`)}`);
    assert(kv1 < kv0, `KV usage fell with the freed blocks (${kv0} -> ${kv1}) although 3 streams still grow`);
    // The step running when the cancel arrived completes; the next plan frees the request (the sample
    // may trail by the scrape's own latency: one more step).
    assert(steps1 - steps0 <= 3, `freed within ${steps1 - steps0} completed steps`);
    assertEq(metricValue(m1, `dsmesh_cancelled_requests_freed_total{${LABELS}}`) - freedBefore, 1, 'one cancelled request freed');
    assertEq(metricValue(m1, `dsmesh_cancel_free_steps_max{${LABELS}}`), 0, 'no plan after the cancel still ran it');
    for (const s of streams.slice(1)) assert(s.events() >= 3, 'the other streams are running');
    const eventsAt = streams.slice(1).map((s) => s.events());
    await sleep(500);
    streams.slice(1).forEach((s, k) => assert(s.events() > eventsAt[k], `stream ${k + 1} kept streaming after the disconnect`));
    // The rest disconnect at once: every slot and block comes back.
    for (const s of streams.slice(1)) s.abort();
    await until(async () => {
      const m = await metricsText(base);
      return metricValue(m, `vllm:num_requests_running{${LABELS}}`) === 0 && metricValue(m, `vllm:kv_cache_usage_perc{${LABELS}}`) === 0 &&
             metricValue(m, `dsmesh_cancelled_requests_freed_total{${LABELS}}`) - freedBefore === 4;
    }, 5000, 'all 4 disconnected requests freed, KV usage 0');
    assertEq(await metric(base, 'dsmesh_cancel_free_steps_max'), 0, 'every cancelled request freed by the next plan');
  }],

  ['/health says why: 503 naming the lost worker while the mesh re-forms, then 200 {"status":"ok"}', async ({ mesh }) => {
    for (const g of mesh.gateways) {
      const r = await fetch(`${g.base}/health`);
      assertEq([r.status, await r.json()], [200, { status: 'ok' }], '/health while serving');
    }
    const victim = mesh.pid('worker1');
    assert(victim, `worker1's pid in up's log:\n${mesh.upLog()}`);
    const t0 = Date.now();
    process.kill(victim, 'SIGKILL');
    const seen = [];
    await until(async () => {
      const r = await fetch(`${mesh.gateways[1].base}/health`);
      seen.push({ status: r.status, retryAfter: r.headers.get('retry-after'), body: await r.json(), t: Date.now() - t0 });
      return seen.some((s) => s.status === 503) && seen[seen.length - 1].status === 200;
    }, 30000, '/health 503 then 200 after the SIGKILL');
    const bad = seen.filter((s) => s.status === 503);
    for (const s of bad) {
      assertEq(s.body.status, 'unavailable', '503 status field');
      assertEq(s.retryAfter, '1', 'Retry-After');
      assert(/worker rank 1/.test(s.body.reason) && /re-forming/.test(s.body.reason), `reason names the worker: ${s.body.reason}`);
    }
    assertEq(seen[seen.length - 1].body, { status: 'ok' }, '/health after the worker came back');
    console.log(`     503 from ${bad[0].t} to ${bad[bad.length - 1].t} ms after the kill, e.g. ${JSON.stringify(bad[bad.length - 1].body)}`);
  }],
];

await runCases(cases, {
  setup: async () => ({
    mesh: await startRealMesh({ maxNumSeqs: SLOTS, gateways: 3, maxQueued: [null, null, 0],
                                upArgs: ['--max-queued', String(QUEUED), '--enable-prefix-caching', 'false'] }),
  }),
  teardown: async ({ mesh }) => { if (mesh) await mesh.stop(); },
});

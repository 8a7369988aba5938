// End to end with the real mesh: `dsmesh up` (dsmesh-coordinator + 2 CPU dsmesh-worker ranks +
// dsmesh-gateway) serving the tiny DeepSeek-V4 model made by `dsmesh make-tiny`, driven by the official
// openai client. No fixture anywhere: tokens come from the model forward pass on the workers.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { assert, assertEq, loadOpenAI, metricsText, metricValue, runCases, track, waitHealthy } from './harness.mjs';

const OpenAI = await loadOpenAI();
const args = process.argv.slice(2);
const DSMESH = path.resolve(args[args.indexOf('--dsmesh') + 1]);

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

const MODEL = 'dsmesh-e2e';
const API_KEY = 'e2e-secret-key';

async function startUp() {
  const dir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'e2e-'));
  const model = path.join(dir, 'tiny');
  const mk = spawnSync(DSMESH, ['make-tiny', '--out', model], { encoding: 'utf8' });
  assertEq(mk.status, 0, `make-tiny: ${mk.stderr}`);
  const port = await freePort();
  // The gateway flags go through `up` (--served-model-name, --api-key, --max-queued), and so do the
  // coordinator's scheduling flags: checked below. 64M of KV per rank holds fewer tokens for one sequence
  // than the model's context (1M), so the pool is the limit a too-big request meets.
  const up = track(spawn(DSMESH, ['up', '--model', model, '--world', '2', '--port', String(port), '--kv-memory', '64M', '--max-num-seqs', '4',
    '--served-model-name', MODEL, '--api-key', API_KEY, '--max-queued', '32',
    '--scheduling-policy', 'priority', '--long-prefill-token-threshold', '64'],
    { stdio: ['ignore', 'ignore', 'pipe'] }), 'SIGINT');
  let log = '';
  up.stderr.on('data', (d) => { log += d; if (process.env.GATEWAY_TEST_VERBOSE) process.stderr.write(d); });
  const base = `http://127.0.0.1:${port}`;
  await waitHealthy(base, 120000).catch((e) => { throw new Error(`${e.message}\n${log}`); });
  return {
    base, url: `${base}/v1`, log: () => log,
    async stop() {
      up.kill('SIGINT');
      await new Promise((r) => { up.once('exit', r); setTimeout(r, 20000); });
    },
  };
}

const client = (m) => new OpenAI({ baseURL: m.url, apiKey: API_KEY, maxRetries: 0, timeout: 120000 });
const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name three colors.' }];

const cases = [
  ['up hands --served-model-name and --api-key to the gateway: 401 without the key, /health open', async ({ m }) => {
    const models = await client(m).models.list();
    assertEq(models.data.map((x) => x.id), [MODEL], 'served model name');
    const body = JSON.stringify({ model: MODEL, prompt: [0, 1, 2], max_tokens: 1 });
    for (const headers of [{}, { authorization: 'Bearer wrong-key' }]) {
      const r = await fetch(`${m.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
      const text = await r.text();
      assertEq(r.status, 401, `no/wrong key: ${text}`);
      assertEq(typeof JSON.parse(text).error.message, 'string', `OpenAI error body: ${text}`);
    }
    assertEq((await fetch(`${m.base}/health`)).status, 200, '/health needs no key');
  }],
  ['chat: greedy is deterministic, usage from the engine, prompt counted like /tokenize', async ({ m }) => {
    const body = { model: MODEL, messages, max_tokens: 8, temperature: 0, ignore_eos: true };
    const a = await client(m).chat.completions.create(body);
    const b = await client(m).chat.completions.create(body);
    assertEq(a.choices[0].finish_reason, 'length', 'finish_reason');
    assertEq(a.usage.completion_tokens, 8, 'completion_tokens');
    const tk = await (await fetch(`${m.base}/tokenize`, { method: 'POST', body: JSON.stringify({ messages }) })).json();
    assertEq(a.usage.prompt_tokens, tk.count, 'prompt tokens');
    const text = (r) => (r.choices[0].message.reasoning_content ?? '') + (r.choices[0].message.content ?? '');
    assert(text(a).length > 0, 'some text');
    assertEq(text(b), text(a), 'greedy twice');
  }],
  ['stream with include_usage equals the non-streamed answer', async ({ m }) => {
    const body = { model: MODEL, messages, max_tokens: 10, temperature: 0, ignore_eos: true };
    const whole = await client(m).chat.completions.create(body);
    let text = '', usage = null, role = null;
    for await (const c of await client(m).chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } })) {
      for (const ch of c.choices) { role ??= ch.delta.role; text += (ch.delta.reasoning_content ?? '') + (ch.delta.content ?? ''); }
      if (c.usage) usage = c.usage;
    }
    assertEq(role, 'assistant', 'role');
    assertEq(text, (whole.choices[0].message.reasoning_content ?? '') + (whole.choices[0].message.content ?? ''), 'same text');
    assertEq(usage, whole.usage, 'same usage');
  }],
  ['seeded sampling repeats; completions with token ids', async ({ m }) => {
    const body = { model: MODEL, messages, max_tokens: 8, temperature: 0.9, seed: 1234, ignore_eos: true };
    const a = await client(m).chat.completions.create(body), b = await client(m).chat.completions.create(body);
    assertEq(b.choices[0].message, a.choices[0].message, 'same seed, same output');
    const c = await client(m).completions.create({ model: MODEL, prompt: [0, 100, 200, 300], max_tokens: 6, temperature: 0, ignore_eos: true });
    assertEq(c.usage.prompt_tokens, 4, 'prompt ids');
    assertEq(c.usage.completion_tokens, 6, 'completion tokens');
  }],
  ['stop strings and stop_token_ids on real model output; logprobs from the sampler', async ({ m }) => {
    const base = { model: MODEL, prompt: [0, 11, 22, 33, 44], max_tokens: 16, temperature: 0, ignore_eos: true };
    const full = await client(m).completions.create({ ...base, logprobs: 2 });
    const text = full.choices[0].text;
    const lp = full.choices[0].logprobs;
    assertEq(lp.tokens.length, 16, 'one logprob entry per generated token');
    for (const t of lp.top_logprobs) assertEq(Object.keys(t).length <= 2 && Object.keys(t).length >= 1, true, 'top_logprobs size');
    for (const v of lp.token_logprobs) assert(v <= 0, 'log probabilities are <= 0');
    // A stop string from the middle of the greedy text: the answer is the text before it.
    // (the first position at or after the middle whose 2-character substring occurs there first).
    assert(text.length >= 4, `greedy text long enough: ${JSON.stringify(text)}`);
    let k = Math.floor(text.length / 2);
    while (k > 0 && text.indexOf(text.slice(k, k + 2)) !== k) k = (k + 1 < text.length - 1) ? k + 1 : 0;
    const cut = text.slice(k, k + 2);
    const stopped = await client(m).completions.create({ ...base, stop: [cut] });
    assertEq(stopped.choices[0].text, text.slice(0, k), `text before the stop string ${JSON.stringify(cut)}`);
    assertEq(stopped.choices[0].finish_reason, 'stop', 'finish_reason');
    // stop_token_ids: the 4th greedy token ends the request after 4 tokens (the stop token is not text).
    const ids = (await (await fetch(`${m.base}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: text, add_special_tokens: false }) })).json()).tokens;
    const chat = await fetch(`${m.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
      body: JSON.stringify({ ...base, stop_token_ids: [ids[3]], logprobs: 0 }) });
    const j = await chat.json();
    assertEq(j.choices[0].finish_reason, 'stop', `stop_token_ids finish: ${JSON.stringify(j)}`);
    assert(j.usage.completion_tokens <= 4, `stopped by the token id after <= 4 tokens: ${j.usage.completion_tokens}`);
    assertEq(j.choices[0].stop_reason, ids[3], 'stop_reason is the token id');
  }],
  ['8 concurrent streams over 4 slots all complete', async ({ m }) => {
    const one = async (i) => {
      let u = null;
      for await (const c of await client(m).chat.completions.create({ model: MODEL, stream: true, stream_options: { include_usage: true },
        max_tokens: 6, temperature: 0, ignore_eos: true, messages: [{ role: 'user', content: `request ${i}` }] })) if (c.usage) u = c.usage;
      return u.completion_tokens;
    };
    const counts = await Promise.all(Array.from({ length: 8 }, (_, i) => one(i)));
    assertEq(counts, Array(8).fill(6), 'tokens per request');
  }],
  ['client disconnect aborts the request in the mesh (slot and KV freed)', async ({ m }) => {
    const controller = new AbortController();
    const stream = await client(m).chat.completions.create({ model: MODEL, messages, max_tokens: 5000, temperature: 0, ignore_eos: true, stream: true },
      { signal: controller.signal });
    let n = 0;
    try { for await (const c of stream) { if (++n === 3) controller.abort(); } } catch (e) { /* aborted */ }
    const deadline = Date.now() + 10000;
    let running, kv;
    while (Date.now() < deadline) {
      const t = await metricsText(m.base);
      running = metricValue(t, `vllm:num_requests_running{model_name="${MODEL}",engine="0"}`);
      kv = metricValue(t, `vllm:kv_cache_usage_perc{model_name="${MODEL}",engine="0"}`);
      if (running === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assertEq(running, 0, 'no request running after the disconnect');
    assert(kv < 0.01, `KV usage back near zero: ${kv}`);
  }],
  ['priority: up passes the scheduling flags; an integer is served, anything else is a 400 naming it', async ({ m }) => {
    assert(/scheduling policy priority, long-prefill-token-threshold 64/.test(m.log()), 'coordinator flags through up');
    const ok = await client(m).chat.completions.create({ model: MODEL, messages, max_tokens: 3, temperature: 0, ignore_eos: true, priority: -5 });
    assertEq(ok.usage.completion_tokens, 3, 'priority -5 served');
    for (const priority of ['high', 1.5, true, [1], 2 ** 40]) {
      const r = await fetch(`${m.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
        body: JSON.stringify({ model: MODEL, messages, max_tokens: 3, priority, stream: true }) });
      const text = await r.text();
      assertEq(r.status, 400, `priority ${JSON.stringify(priority)}: ${text}`);
      const e = JSON.parse(text).error;
      assertEq([e.type, e.param], ['invalid_request_error', 'priority'], `error body: ${text}`);
    }
  }],
  ['a request the KV pool can never hold: 400 naming both numbers at once, streamed or not; others unaffected', async ({ m }) => {
    const beside = client(m).chat.completions.create({ model: MODEL, messages, max_tokens: 12, temperature: 0, ignore_eos: true });
    for (const stream of [false, true]) {
      const t0 = Date.now();
      const r = await fetch(`${m.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
        body: JSON.stringify({ model: MODEL, prompt: [0, 1, 2], max_tokens: 400000, stream }) });
      const text = await r.text();
      assertEq(r.status, 400, `stream ${stream}: ${text}`);
      const e = JSON.parse(text).error;
      const found = /holds at most (\d+) tokens for one sequence\. However, you requested (\d+) tokens/.exec(e.message);
      assert(found, `both numbers in: ${e.message}`);
      assertEq(Number(found[2]), 400003, 'requested = prompt + max_tokens');
      assert(Number(found[1]) < 400003 && Number(found[1]) > 1000, `pool room ${found[1]}`);
      assertEq(e.type, 'invalid_request_error', 'type');
      // A 400 (not a stream) already says the request ran nothing; the wall bound only catches a refusal that
      // waited on something, with room for a 2-core machine running the whole suite.
      assert(Date.now() - t0 < 10000, `refused at once (${Date.now() - t0} ms)`);
    }
    assertEq((await beside).usage.completion_tokens, 12, 'the request beside it finished');
  }],
  ['metrics from the real coordinator: per-rank step time, promtool parses', async ({ m }) => {
    const t = await metricsText(m.base);
    assert(metricValue(t, `vllm:num_preemptions_total{model_name="${MODEL}",engine="0"}`) >= 0, 'vllm:num_preemptions_total');
    for (const rank of ['0', '1'])
      assert(metricValue(t, `dsmesh_worker_steps_total{model_name="${MODEL}",rank="${rank}"}`) > 0, `rank ${rank} steps`);
    assert(metricValue(t, `vllm:generation_tokens_total{model_name="${MODEL}",engine="0"}`) > 0, 'generation tokens');
    const r = spawnSync('promtool', ['check', 'metrics'], { input: t, encoding: 'utf8' });
    assert(r.status === 0 || r.status === 3, `promtool: ${r.stdout}${r.stderr}`);
    const other = `${r.stdout}${r.stderr}`.split('\n').filter((l) => l.trim() && !/^vllm:\S+ metric names should not contain ':'$/.test(l));
    assertEq(other, [], 'promtool findings');
  }],
  ['dsmesh bench --url runs the reference deployment\'s method against the mesh', async ({ m }) => {
    const r = spawnSync(DSMESH, ['bench', '--url', m.base, '--api-key', API_KEY, '--max-tokens', '8', '--prompts', 'en,ja', '--streams', '1,2'], { encoding: 'utf8' });
    assertEq(r.status, 0, `bench exit status: ${r.stderr}`);
    const rows = r.stdout.split('\n').filter((l) => /^(en|ja)\s+\d/.test(l));
    assertEq(rows.length, 4, `table rows:\n${r.stdout}`);
    for (const row of rows) {
      const [, streams, ttft, decode, agg] = row.trim().split(/\s+/);
      assert(Number(ttft) > 0 && Number(decode) > 0 && Number(agg) > 0, `numbers in ${row}`);
      void streams;
    }
    console.log(r.stdout.trimEnd().split('\n').map((l) => `     ${l}`).join('\n'));
  }],
];

await runCases(cases, { setup: async () => ({ m: await startUp() }), teardown: async ({ m }) => m.stop() });

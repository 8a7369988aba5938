// /metrics checked by things nobody here wrote: `promtool check metrics` (Prometheus' own linter) on
// the exposition, and a real Prometheus server that scrapes the gateway and answers PromQL queries for
// TTFT and token counts through its HTTP API. Also: vLLM's names, types, labels and TTFT buckets, and
// counters that agree with the usage the client saw.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { assert, assertEq, loadOpenAI, metricsText, metricValue, runCases, ROOT, startMesh, track, V4_TOKENIZER_DIR } from './harness.mjs';

const OpenAI = await loadOpenAI();
const MODEL = 'dsmesh-test';
const LABELS = `model_name="${MODEL}",engine="0"`;

// Every name the issue lists (counters by their exposed _total name).
const REQUIRED = {
  'vllm:num_requests_running': 'gauge', 'vllm:num_requests_waiting': 'gauge', 'vllm:kv_cache_usage_perc': 'gauge',
  'vllm:prompt_tokens_total': 'counter', 'vllm:generation_tokens_total': 'counter', 'vllm:request_success_total': 'counter',
  'vllm:time_to_first_token_seconds': 'histogram', 'vllm:inter_token_latency_seconds': 'histogram',
  'vllm:e2e_request_latency_seconds': 'histogram', 'vllm:request_queue_time_seconds': 'histogram',
  'vllm:request_prompt_tokens': 'histogram', 'vllm:request_generation_tokens': 'histogram',
  'vllm:prefix_cache_queries_total': 'counter', 'vllm:prefix_cache_hits_total': 'counter',
  'vllm:spec_decode_num_drafts_total': 'counter', 'vllm:spec_decode_num_draft_tokens_total': 'counter',
  'vllm:spec_decode_num_accepted_tokens_total': 'counter', 'vllm:spec_decode_num_accepted_tokens_per_pos_total': 'counter',
  'vllm:spec_decode_draft_decisions_total': 'counter',
  'dsmesh_worker_step_time_seconds_total': 'counter', 'dsmesh_worker_collective_time_seconds_total': 'counter',
  'dsmesh_image_inputs_total': 'counter', 'dsmesh_image_tokens_total': 'counter',
  'dsmesh_malformed_tool_call_blocks_total': 'counter', 'dsmesh_suppressed_tool_calls_total': 'counter',
};
// vLLM loggers.py bounds, as prometheus_client writes them.
const TTFT_LE = ['0.001', '0.005', '0.01', '0.02', '0.04', '0.06', '0.08', '0.1', '0.25', '0.5', '0.75', '1.0', '2.5', '5.0',
  '7.5', '10.0', '20.0', '40.0', '80.0', '160.0', '640.0', '2560.0', '+Inf'];

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

async function traffic(mesh, n) {
  const c = new OpenAI({ baseURL: mesh.url, apiKey: 'x', maxRetries: 0 });
  let prompt = 0, completion = 0;
  for (let i = 0; i < n; i++) {
    const chunks = [];
    for await (const ch of await c.chat.completions.create({ model: MODEL, stream: true, stream_options: { include_usage: true },
      temperature: 0, messages: [{ role: 'user', content: `request ${i}: some words to say back, then stop` }] })) chunks.push(ch);
    const u = chunks[chunks.length - 1].usage;
    prompt += u.prompt_tokens;
    completion += u.completion_tokens;
  }
  return { prompt, completion };
}

// `promtool check metrics` on an exposition: it must parse, and lint nothing but the colon of vLLM's names.
function promtoolCheck(text) {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  if (r.error) throw new Error(`promtool not runnable: ${r.error.message} (Debian package prometheus)`);
  // promtool exits 1 on a parse error and 3 on lint findings. vLLM's own names carry a colon, which
  // the linter flags (colons are meant for recording rules); compatibility requires them, so that one
  // finding is allowed for vllm:* names and nothing else is.
  const out = `${r.stdout}${r.stderr}`;
  assert(r.status === 0 || r.status === 3, `promtool exit status ${r.status}; output:\n${out}`);
  const problems = out.split('\n').filter((l) => l.trim() && !/^vllm:\S+ metric names should not contain ':'$/.test(l));
  assertEq(problems, [], 'promtool findings other than the vllm: colon lint');
  return out;
}

const file = (n) => fs.readFileSync(path.join(ROOT, 'common/image/testdata', n));
const dataUrl = (mime, bytes) => `data:${mime};base64,${Buffer.from(bytes).toString('base64')}`;
// The ids of the image blocks (alignment pads, IMAGE_START, IMAGE, IMAGE_NEWLINE, IMAGE_END: 129257..129261).
const isImageBlockId = (id) => id >= 129257 && id <= 129261;

const cases = [
  ['exposition passes promtool check metrics', async ({ mesh }) => {
    await traffic(mesh, 2);
    const out = promtoolCheck(await metricsText(mesh.base));
    assert(out.includes('vllm:time_to_first_token_seconds'), 'promtool saw the histograms (parsed the exposition)');
  }],

  ['image inputs and image tokens (a model with a vision tower)', async ({ mesh }) => {
    // The text-only model's gateway refuses pictures: nothing counted.
    const c = new OpenAI({ baseURL: mesh.url, apiKey: 'x', maxRetries: 0 });
    const png = dataUrl('image/png', file('rgb.png')), jpg = dataUrl('image/jpeg', file('rgb.jpg'));
    const messages = [{ role: 'user', content: [{ type: 'image_url', image_url: { url: png } },
      { type: 'text', text: 'and' }, { type: 'image_url', image_url: { url: jpg } }] }];
    const refused = await c.chat.completions.create({ model: MODEL, max_tokens: 3, messages }).then(() => null, (e) => e);
    assertEq(refused?.status, 400, 'a text model refuses pictures');
    const text = await metricsText(mesh.base);
    assertEq(metricValue(text, `dsmesh_image_inputs_total{${LABELS}}`), 0, 'no image counted on a refusal');

    const vision = await startMesh({ tokensPerStep: 3, modelConfig: { vision_n_layers: 2 }, tokenizerDir: V4_TOKENIZER_DIR });
    try {
      const v = new OpenAI({ baseURL: vision.url, apiKey: 'x', maxRetries: 0 });
      const before = await metricsText(vision.base);
      const r = await v.chat.completions.create({ model: MODEL, max_tokens: 3, temperature: 0, messages });
      const t = await (await fetch(`${vision.base}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, messages }) })).json();
      const blockTokens = t.tokens.filter(isImageBlockId).length;
      assert(blockTokens > 10 && blockTokens < r.usage.prompt_tokens, `${blockTokens} block tokens of ${r.usage.prompt_tokens}`);
      const after = await metricsText(vision.base);
      const d = (name) => metricValue(after, name) - (metricValue(before, name) ?? 0);
      assertEq(d(`dsmesh_image_inputs_total{${LABELS}}`), 2, 'two pictures');
      assertEq(d(`dsmesh_image_tokens_total{${LABELS}}`), blockTokens, 'their blocks\' tokens, as /tokenize shows them');
      assertEq(d(`vllm:prompt_tokens_total{${LABELS}}`), r.usage.prompt_tokens, 'prompt tokens (blocks included)');
      // A text request adds to neither.
      await traffic(vision, 1);
      const later = await metricsText(vision.base);
      assertEq(metricValue(later, `dsmesh_image_inputs_total{${LABELS}}`), metricValue(after, `dsmesh_image_inputs_total{${LABELS}}`),
        'a text request counts no image');
      assertEq(metricValue(later, `dsmesh_image_tokens_total{${LABELS}}`), metricValue(after, `dsmesh_image_tokens_total{${LABELS}}`),
        'a text request counts no image tokens');
      promtoolCheck(later);
    } finally {
      await vision.stop();
    }
  }],

  ['vLLM names, types, labels and buckets', async ({ mesh }) => {
    const text = await metricsText(mesh.base);
    const types = {};
    for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) types[m[1]] = m[2];
    for (const [name, type] of Object.entries(REQUIRED)) assertEq(types[name], type, `TYPE of ${name}`);
    const le = [...text.matchAll(new RegExp(`^vllm:time_to_first_token_seconds_bucket\\{${LABELS},le="([^"]+)"\\}`, 'gm'))].map((m) => m[1]);
    assertEq(le, TTFT_LE, 'TTFT bucket bounds');
    for (const reason of ['stop', 'length', 'abort'])
      assert(metricValue(text, `vllm:request_success_total{${LABELS},finished_reason="${reason}"}`) !== undefined, `finished_reason=${reason}`);
    assert(metricValue(text, `vllm:spec_decode_num_accepted_tokens_per_pos_total{${LABELS},position="0"}`) > 0, 'per-position acceptance');
    for (const decision of ['full', 'reduced', 'off', 'probe', 'calibrate'])
      assert(metricValue(text, `vllm:spec_decode_draft_decisions_total{${LABELS},decision="${decision}"}`) !== undefined,
        `draft policy decision=${decision}`);
  }],

  ['counters agree with the usage the client saw', async ({ mesh }) => {
    const before = await metricsText(mesh.base);
    const used = await traffic(mesh, 3);
    const after = await metricsText(mesh.base);
    const d = (name) => metricValue(after, name) - (metricValue(before, name) ?? 0);
    assertEq(d(`vllm:prompt_tokens_total{${LABELS}}`), used.prompt, 'prompt tokens');
    assertEq(d(`vllm:generation_tokens_total{${LABELS}}`), used.completion, 'generation tokens');
    assertEq(d(`vllm:time_to_first_token_seconds_count{${LABELS}}`), 3, 'one TTFT observation per request');
    assertEq(d(`vllm:request_success_total{${LABELS},finished_reason="stop"}`), 3, 'successes');
    // The fixture emits 3 tokens per step (2 drafts, both accepted): acceptance length 3.
    const drafts = d(`vllm:spec_decode_num_drafts_total{${LABELS}}`), acc = d(`vllm:spec_decode_num_accepted_tokens_total{${LABELS}}`);
    assert(drafts > 0, 'drafts counted');
    assert(Math.abs(1 + acc / drafts - 3) < 0.5, `acceptance length ${1 + acc / drafts}`);
  }],

  ['a real Prometheus server scrapes the gateway and answers PromQL', async ({ mesh }) => {
    const used = await traffic(mesh, 2);
    const dir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'prom-'));
    const target = mesh.base.replace('http://', '');
    fs.writeFileSync(path.join(dir, 'prometheus.yml'),
      // scrape_timeout defaults to min(10s, scrape_interval): at 1s a gateway slowed by a loaded 2-core CI
      // machine missed every scrape (up = 0 for the whole deadline), so scrape every 3s with a 3s timeout.
      `global:\n  scrape_interval: 3s\n  scrape_timeout: 3s\nscrape_configs:\n  - job_name: dsmesh-gateway\n    static_configs:\n      - targets: ['${target}']\n`);
    const port = await freePort();
    const prom = track(spawn('prometheus', [`--config.file=${path.join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${path.join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`], { stdio: ['ignore', 'ignore', 'pipe'] }));
    let log = '';
    prom.stderr.on('data', (x) => { log += x; });
    const query = async (q) => {
      const r = await fetch(`http://127.0.0.1:${port}/api/v1/query?query=${encodeURIComponent(q)}`);
      const j = await r.json();
      if (j.status !== 'success') throw new Error(`query ${q}: ${JSON.stringify(j)}`);
      return j.data.result;
    };
    try {
      const deadline = Date.now() + 60000;
      let gen = [], ttftCount = [], up = [];
      while (Date.now() < deadline) {
        try {
          up = await query('up{job="dsmesh-gateway"}');
          gen = await query(`vllm:generation_tokens_total{model_name="${MODEL}"}`);
          ttftCount = await query(`vllm:time_to_first_token_seconds_count{model_name="${MODEL}"}`);
          // All three from one poll: a failed scrape between the up query and the others (a loaded machine)
          // must not end the loop with a stale up = 0.
          if (up.length && up[0].value[1] === '1' && gen.length && ttftCount.length && Number(gen[0].value[1]) > 0) break;
        } catch (e) { /* not up yet */ }
        await new Promise((r) => setTimeout(r, 250));
      }
      if (!(up.length && up[0].value[1] === '1')) {
        // Say why: Prometheus keeps the last scrape error of every target.
        const t = await fetch(`http://127.0.0.1:${port}/api/v1/targets`).then((r) => r.json()).catch((e) => ({ error: String(e) }));
        const health = (t.data?.activeTargets || []).map((x) => `${x.scrapeUrl}: ${x.health} ${x.lastError || ''}`).join('; ');
        assert(false, `target up (targets: ${health || JSON.stringify(t)}); prometheus log:\n${log.slice(-2000)}`);
      }
      assert(gen.length === 1, 'generation tokens series present');
      assert(Number(gen[0].value[1]) >= used.completion, `generation tokens ${gen[0].value[1]} >= ${used.completion}`);
      assert(Number(ttftCount[0].value[1]) >= 2, 'TTFT observations');
      const p50 = await query(`histogram_quantile(0.5, sum by (le) (vllm:time_to_first_token_seconds_bucket{model_name="${MODEL}"}))`);
      const ttft = Number(p50[0].value[1]);
      assert(ttft > 0 && ttft < 5, `TTFT p50 from PromQL: ${ttft}`);
      console.log(`     PromQL: generation tokens ${gen[0].value[1]}, TTFT p50 ${ttft.toFixed(4)} s`);
    } finally {
      prom.kill('SIGTERM');
      await new Promise((r) => { prom.once('exit', r); setTimeout(r, 5000); });
    }
  }],
];

await runCases(cases, {
  setup: async () => ({ mesh: await startMesh({ tokensPerStep: 3 }) }),
  teardown: async ({ mesh }) => mesh.stop(),
});

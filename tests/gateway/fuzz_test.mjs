// Fuzzes the HTTP/JSON surface, strictly:
//  - schema: every field of the chat-completions and completions request schemas (OpenAI's, plus the
//    vLLM extensions the gateway reads) is given each value of a fixed list of odd values. A value the
//    schema allows must be served (200); any other value must get a 400 whose error.param names that
//    field (404 for an unknown model), as vLLM answers. The expectation comes from a predicate per
//    field written from the schema, not from what the gateway happens to do.
//  - bytes: random and truncated bodies, malformed UTF-8 (overlong, surrogates, truncated, 0xFF) and raw
//    NUL bytes anywhere in a body, escaped NULs in strings, nesting 100000 deep (refused) and 500 deep
//    inside a field (served), numbers beyond 64 bits / the double range: every answer a 4xx with an
//    OpenAI error body (or a 200 for the few that are valid requests), never a 5xx or a dropped request.
//  - connections: malformed HTTP on a raw socket, 100 MB bodies (announced and chunked, 8 at once),
//    slow-loris clients (64 sockets dribbling headers or a body), half-closed connections (shutdown of
//    the client's write side before, during and after a request): no crash, no hang, every such socket
//    closed by the server within its timeout, the gateway still serving, its peak RSS bounded (printed).
// Deterministic (seeded PRNG) so a failure reproduces.
import fs from 'node:fs';
import net from 'node:net';
import { assert, assertEq, loadOpenAI, metricsText, metricValue, runCases, startMesh } from './harness.mjs';

const OpenAI = await loadOpenAI();
const MODEL = 'dsmesh-test';
const LABELS = 'model_name="dsmesh-test",engine="0"';
let seed = 12345;
const rand = () => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x7fffffff; };
const pick = (a) => a[Math.floor(rand() * a.length)];

const VALID_CHAT = { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0,
  chat_template_kwargs: { thinking: false } };
const VALID_COMPLETION = { model: MODEL, prompt: 'hi', max_tokens: 4, temperature: 0 };
const WEIRD = [null, true, false, 0, -1, 1e308, -1e308, 1.5, 2 ** 31, 2 ** 53, -(2 ** 63), '', 'x', '\u0000', '💥', [], [1], [null],
  {}, { a: 1 }, 'a'.repeat(10000), [[[[]]]], 1e-300, 'auto', 'text', [{ type: 'function', function: { name: 'f' } }],
  { type: 'text' }, { thinking: true }, ['text'], 7, 0.5];

// ---- the schemas: field -> does the value satisfy it (null = absent, allowed for optional fields) ----
const isInt = (v) => typeof v === 'number' && Number.isInteger(v);
const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
const isBool = (v) => typeof v === 'boolean';
const isStr = (v) => typeof v === 'string';
const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const opt = (f) => (v) => v === null || f(v);
const between = (lo, hi) => (v) => isNum(v) && v >= lo && v <= hi;
const oneOf = (...xs) => (v) => xs.includes(v);
const absent = (v) => v === null;
const MAX_LEN = 4096;  // the fixture's max_model_len: max_tokens + the prompt must fit
const COMMON = {
  model: opt(oneOf(MODEL)),
  stream: opt(isBool),
  stream_options: absent,  // only with stream: true (checked below with a streaming base)
  max_tokens: opt((v) => isInt(v) && v >= 1 && v <= MAX_LEN - 16),
  temperature: opt(between(0, 2)),
  top_p: opt((v) => isNum(v) && v > 0 && v <= 1),
  seed: opt((v) => isInt(v) && Math.abs(v) <= 2 ** 62),
  stop: opt((v) => (isStr(v) && v !== '') || (Array.isArray(v) && v.length <= 16 && v.every((s) => isStr(s) && s !== ''))),
  n: opt((v) => isInt(v) && v >= 1 && v <= 128),  // choices (the base sends no best_of)
  presence_penalty: opt(between(-2, 2)),
  frequency_penalty: opt(between(-2, 2)),
  logit_bias: opt((v) => isObj(v) && Object.keys(v).length === 0),  // a bias is not applied, so refused
  user: opt(isStr),
  response_format: opt((v) => isObj(v) && v.type === 'text'),
  // vLLM's extensions
  top_k: opt((v) => isInt(v) && v >= -1 && v < 2 ** 31),
  min_p: opt(between(0, 1)),
  repetition_penalty: opt(between(1e-6, 100)),  // logits are divided by it (float): 1e-6 is the floor
  stop_token_ids: opt((v) => Array.isArray(v) && v.every((x) => isInt(x) && x >= 0 && x < 2 ** 31)),
  ignore_eos: opt(isBool),
  skip_special_tokens: opt(isBool),
  include_stop_str_in_output: opt(oneOf(false)),
  add_special_tokens: opt(isBool),
  priority: opt((v) => isInt(v) && v >= -(2 ** 31) && v < 2 ** 31),
  request_id: opt(isStr),
};
const message = (m) => isObj(m) && oneOf('system', 'user', 'assistant', 'tool')(m.role) && (isStr(m.content) || m.role === 'assistant');
const CHAT = {
  ...COMMON,
  messages: (v) => Array.isArray(v) && v.length > 0 && v.every(message),
  max_completion_tokens: COMMON.max_tokens,
  logprobs: opt(isBool),
  top_logprobs: opt(oneOf(0)),  // more needs logprobs: true
  tools: opt((v) => Array.isArray(v) && v.every((t) => isObj(t) && t.type === 'function' && isObj(t.function) && isStr(t.function.name) && t.function.name !== '')),
  tool_choice: opt(oneOf('auto', 'none')),  // forcing a tool needs constrained decoding
  parallel_tool_calls: opt(isBool),
  chat_template_kwargs: opt((v) => isObj(v) && ['thinking', 'enable_thinking'].every((k) => !(k in v) || isBool(v[k]))),
  reasoning_effort: opt(oneOf('none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max')),
  add_generation_prompt: opt(oneOf(true)),  // the V4 encoder always opens the assistant turn
  echo: opt(oneOf(false)),
  metadata: opt((v) => isObj(v) && Object.keys(v).length <= 16 && Object.values(v).every((x) => isStr(x) && x.length <= 512)),
  store: opt(isBool),
  service_tier: opt(oneOf('auto', 'default', 'flex', 'scale', 'priority')),
  verbosity: opt(oneOf('low', 'medium', 'high')),
  modalities: opt((v) => Array.isArray(v) && v.every((x) => x === 'text')),
  prediction: opt((v) => isObj(v) && v.type === 'content' && 'content' in v),
  prompt_cache_key: opt((v) => isStr(v) && v.length <= 1024),
  safety_identifier: opt((v) => isStr(v) && v.length <= 256),
  functions: absent, function_call: absent, audio: absent, web_search_options: absent,
};
const VOCAB = 129280;
const COMPLETIONS = {
  ...COMMON,
  // "" is a prompt: the BOS token (add_special_tokens) is its one token, as in vLLM.
  prompt: (v) => isStr(v) || (Array.isArray(v) && v.length === 1 && isStr(v[0])) ||
    (Array.isArray(v) && v.length > 0 && v.every((x) => isInt(x) && x >= 0 && x < VOCAB)),
  logprobs: opt((v) => isInt(v) && v >= 0 && v <= 20),
  echo: opt(oneOf(false)),
  best_of: opt((v) => isInt(v) && v >= 1 && v <= 128),  // >= n (1 in the base), not streaming
  suffix: opt(oneOf('')),
};
const STREAMING = {
  stream_options: opt((v) => isObj(v) && ['include_usage', 'continuous_usage_stats'].every((k) => !(k in v) || isBool(v[k]))),
};

async function post(base, path, body, contentType = 'application/json') {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': contentType }, body });
  const text = await r.text();
  return { status: r.status, text };
}

function errorBody(res, what) {
  let j;
  try { j = JSON.parse(res.text); } catch (e) { throw new Error(`${what}: error body is not JSON: ${res.text.slice(0, 200)}`); }
  assert(j.error && typeof j.error.message === 'string' && typeof j.error.type === 'string', `${what}: OpenAI error body: ${res.text.slice(0, 200)}`);
  return j.error;
}

// Any 4xx with an OpenAI error body (for inputs that are not requests at all), or 200 where `okAllowed`.
function checkAnswer(res, what, okAllowed = false) {
  assert(res.status < 500, `${what}: got ${res.status}: ${res.text.slice(0, 300)}`);
  if (res.status === 200 && okAllowed) return;
  assert(res.status >= 400, `${what}: got ${res.status} for an invalid request: ${res.text.slice(0, 200)}`);
  errorBody(res, what);
}

const counts = {};
const count = (status) => { counts[status] = (counts[status] ?? 0) + 1; };
const show = (v) => (JSON.stringify(v) ?? String(v)).slice(0, 40);

// Every mismatch is collected, then all are reported at once.
async function schemaFuzz(mesh, path, base, schema) {
  let served = 0, refused = 0;
  const wrong = [];
  for (const [field, allowed] of Object.entries(schema)) {
    for (const v of WEIRD) {
      const body = { ...base, [field]: v };
      const res = await post(mesh.base, path, JSON.stringify(body));
      count(res.status);
      const what = `${path} ${field}=${show(v)}`;
      try {
        if (allowed(v)) {
          assertEq(res.status, 200, `${what} is valid: status (${res.text.slice(0, 200)})`);
          served++;
        } else {
          const expected = field === 'model' && isStr(v) ? 404 : 400;  // a model name we do not serve: 404
          assertEq(res.status, expected, `${what} is invalid: status (${res.text.slice(0, 200)})`);
          assertEq(errorBody(res, what).param, field, `${what}: error.param`);
          refused++;
        }
      } catch (e) { wrong.push(e.message); }
    }
  }
  if (wrong.length) throw new Error(`${wrong.length} answers not as the schema says:\n  ${wrong.join('\n  ')}`);
  return { served, refused };
}

// A raw TCP exchange: writes `data` (string, Buffer or async function(socket)), then waits for the server
// to close; resolves with {text, closedByServer, ms}. `halfClose`: end our side after writing.
function raw(port, data, { halfClose = false, waitMs = 10000 } = {}) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const s = net.connect(port, '127.0.0.1');
    const chunks = [];
    let done = false;
    const finish = (closedByServer) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ text: Buffer.concat(chunks).toString('latin1'), closedByServer, ms: Date.now() - t0 });
    };
    const timer = setTimeout(() => finish(false), waitMs);
    s.on('data', (d) => chunks.push(d));
    s.on('error', () => {});  // EPIPE/ECONNRESET while we still write: 'close' follows, after the data read
    s.on('close', () => finish(true));
    s.on('connect', async () => {
      try {
        if (typeof data === 'function') await data(s);
        else s.write(data);
        if (halfClose) s.end();
      } catch (e) { /* the server closed while we wrote */ }
    });
  });
}
const statusOf = (text) => Number((text.match(/^HTTP\/1\.[01] (\d{3})/) || [])[1] || 0);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const port = (mesh) => Number(mesh.base.split(':').pop());

function rss(mesh) {
  const status = fs.readFileSync(`/proc/${mesh.gateway.pid}/status`, 'utf8');
  const kb = (k) => Number((status.match(new RegExp(`${k}:\\s+(\\d+) kB`)) || [])[1]);
  return { now: kb('VmRSS') / 1024, peak: kb('VmHWM') / 1024 };
}

async function stillServing(mesh, what) {
  assertEq(mesh.gateway.exitCode, null, `${what}: gateway process alive`);
  const c = new OpenAI({ baseURL: mesh.url, apiKey: 'x', maxRetries: 0, timeout: 10000 });
  const r = await c.chat.completions.create(VALID_CHAT);
  assertEq(r.choices[0].message.content, 'hi', `${what}: a normal request works`);
}

async function inFlightDrains(mesh, what) {
  const deadline = Date.now() + 10000;
  let v;
  while (Date.now() < deadline) {
    v = metricValue(await metricsText(mesh.base), `dsmesh_gateway_requests_in_flight{${LABELS}}`);
    if (v === 0) return;
    await sleep(50);
  }
  throw new Error(`${what}: ${v} requests still in flight after 10 s`);
}

const CHAT_REQ = (body, extra = '') =>
  `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`;

const cases = [
  ['schema: each field with each odd value: 200 if the schema allows it, else 400 naming the field', async ({ mesh }) => {
    const chat = await schemaFuzz(mesh, '/v1/chat/completions', VALID_CHAT, CHAT);
    const comp = await schemaFuzz(mesh, '/v1/completions', VALID_COMPLETION, COMPLETIONS);
    const streamChat = await schemaFuzz(mesh, '/v1/chat/completions', { ...VALID_CHAT, stream: true }, STREAMING);
    const streamComp = await schemaFuzz(mesh, '/v1/completions', { ...VALID_COMPLETION, stream: true }, STREAMING);
    const all = [chat, comp, streamChat, streamComp];
    const served = all.reduce((s, x) => s + x.served, 0), refused = all.reduce((s, x) => s + x.refused, 0);
    console.log(`     ${Object.keys(CHAT).length} chat + ${Object.keys(COMPLETIONS).length} completions fields x ${WEIRD.length} values: ${served} served, ${refused} refused naming the field`);
    // Fields outside the schemas are ignored (vLLM logs them), whatever their value.
    // (Except an integer beyond 64 bits: the JSON library cannot hold it, so it is refused, naming the field.)
    for (const v of WEIRD) {
      const res = await post(mesh.base, '/v1/chat/completions', JSON.stringify({ ...VALID_CHAT, not_a_field_xyz: v }));
      if (v === -(2 ** 63)) assertEq(errorBody(res, 'unknown field, 64-bit overflow').param, 'not_a_field_xyz', 'param');
      else assertEq(res.status, 200, `unknown field = ${show(v)}`);
    }
  }],
  ['random bytes, truncated JSON, malformed UTF-8, NUL bytes, deep nesting, huge numbers', async ({ mesh }) => {
    const valid = JSON.stringify(VALID_CHAT);
    for (let i = 0; i < 300; i++) {
      const len = Math.floor(rand() * 400);
      const bytes = Buffer.from(Array.from({ length: len }, () => Math.floor(rand() * 256)));
      const res = await post(mesh.base, pick(['/v1/chat/completions', '/v1/completions', '/tokenize', '/detokenize']), bytes);
      count(res.status);
      checkAnswer(res, `random bytes #${i}`);
    }
    for (let cut = 0; cut < valid.length; cut += 3) {
      const res = await post(mesh.base, '/v1/chat/completions', valid.slice(0, cut));
      count(res.status);
      checkAnswer(res, `truncated at ${cut}`);
    }
    // Malformed UTF-8 and raw NUL bytes spliced into every position of a valid body: each is invalid JSON
    // (a raw control character or a bad byte), so each must be refused.
    const BAD = [[0xff], [0xfe], [0xc0, 0x80], [0xe0, 0x80, 0x80], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xe2, 0x82], [0xf4, 0x90, 0x80, 0x80],
      [0xf8, 0x88, 0x80, 0x80, 0x80], [0x80], [0x00]];
    const validBytes = Buffer.from(valid);
    for (let pos = 1; pos < validBytes.length; pos += 2) {
      const bad = BAD[pos % BAD.length];
      const body = Buffer.concat([validBytes.subarray(0, pos), Buffer.from(bad), validBytes.subarray(pos)]);
      const res = await post(mesh.base, '/v1/chat/completions', body);
      count(res.status);
      checkAnswer(res, `bytes ${bad.map((b) => b.toString(16))} at ${pos}`);
    }
    const deep = (n, leaf = 1) => '{"a":'.repeat(n) + JSON.stringify(leaf) + '}'.repeat(n);
    const specials = [
      // [body, may it be served?]
      [Buffer.concat([Buffer.from('{"model":"dsmesh-test","messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc0, 0x80]), Buffer.from('"}]}')]), false],
      [Buffer.concat([Buffer.from('{"prompt":"'), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('"}')]), false],
      ['{"prompt":"\\ud800"}', false],
      ['{"model":"dsmesh-test","messages":[{"role":"user","content":"a\\u0000b"}],"max_tokens":2}', true],
      ['{"model":"dsmesh-test","prompt":"a\\u0000b","max_tokens":2,"stop":"\\u0000"}', true],
      ['['.repeat(100000) + ']'.repeat(100000), false],
      [deep(100000), false],
      [`{"model":"dsmesh-test","messages":[{"role":"user","content":"x"}],"max_tokens":2,"chat_template_kwargs":${deep(500)}}`, true],
      [`{"model":"dsmesh-test","messages":[{"role":"user","content":"x"}],"max_tokens":2,"tools":[{"type":"function","function":{"name":"f","parameters":${deep(500)}}}]}`, true],
      [`{"model":"dsmesh-test","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":${deep(5000)}}}]}`, false],
      ['{"model":"dsmesh-test","prompt":"x","max_tokens":123456789012345678901234567890}', false],
      ['{"model":"dsmesh-test","prompt":"x","seed":18446744073709551616}', false],
      ['{"model":"dsmesh-test","prompt":"x","temperature":1e400}', false],
      ['{"model":"dsmesh-test","prompt":"x","max_tokens":-0}', false],
      ['{"model":"dsmesh-test","prompt":[]}', false],
      ['{"model":"dsmesh-test","messages":[]}', false],
      ['{"model":"dsmesh-test","messages":[{}]}', false],
      ['{"model":"dsmesh-test","messages":[{"role":"user","content":[{"type":"image_url"}]}]}', false],
      // non-JSON arguments in a past assistant call: the V4 encoder renders them verbatim
      ['{"model":"dsmesh-test","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{not json"}}]}]}', true],
      ['{"model":"dsmesh-test","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}', false],
      ['"just a string"', false], ['null', false], ['123', false], ['{}', false],
      ['{"model":"dsmesh-test","prompt":"x"}{"trailing":1}', false],
    ];
    for (const [i, [body, servable]] of specials.entries()) {
      for (const path of ['/v1/chat/completions', '/v1/completions', '/tokenize']) {
        const res = await post(mesh.base, path, body);
        count(res.status);
        // /tokenize ignores sampling fields, so a body that only breaks those may be tokenized.
        checkAnswer(res, `special #${i} on ${path}`, servable || path === '/tokenize');
      }
    }
  }],
  ['malformed HTTP on a raw socket gets a 4xx, never a crash', async ({ mesh }) => {
    const requests = [
      'GARBAGE\r\n\r\n',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{}',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n',
      `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(100000)}\r\n\r\n`,
      'GET /health HTTP/9.9\r\n\r\n',
      'GET /hea\0lth HTTP/1.1\r\nHost: x\r\n\r\n',
      'GET /health HTTP/1.1\r\nHost: x\r\nX-Nul: a\0b\r\n\r\n',
      Buffer.concat([Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\nX-Bad: '), Buffer.from([0xff, 0xc0, 0x80]), Buffer.from('\r\n\r\n')]),
    ];
    for (const [i, req] of requests.entries()) {
      const answer = await raw(port(mesh), req, { waitMs: 3000 });
      const status = statusOf(answer.text);
      if (status) count(status);
      // A header with bytes >= 0x80 is legal obs-text: /health may answer 200 to it.
      assert(status === 0 || (status >= 400 && status < 500) || (i === 9 && status === 200), `raw #${i}: status ${status}`);
    }
    await stillServing(mesh, 'after malformed HTTP');
  }],
  ['100 MB bodies (announced and chunked, 8 at once) are refused with 413; memory stays bounded', async ({ strict }) => {
    const before = rss(strict);
    const MB = 1 << 20;
    const block = Buffer.alloc(MB, 0x61);
    const upload = (chunked) => async (s) => {
      s.setMaxListeners(0);
      s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${chunked ? 'Transfer-Encoding: chunked' : `Content-Length: ${100 * MB}`}\r\n\r\n`);
      for (let i = 0; i < 100 && !s.destroyed; i++) {
        const piece = chunked ? Buffer.concat([Buffer.from(`${MB.toString(16)}\r\n`), block, Buffer.from('\r\n')]) : block;
        if (!s.write(piece)) await new Promise((r) => { s.once('drain', r); s.once('close', r); });
      }
    };
    const results = await Promise.all(Array.from({ length: 8 }, (_, i) => raw(port(strict), upload(i % 2 === 1), { waitMs: 30000 })));
    let cut = 0;
    for (const [i, r] of results.entries()) {
      assert(r.closedByServer, `upload #${i}: the server closed the connection`);
      // An upload that has not reached the limit within --idle-timeout-s (2 s here; a loaded machine) is
      // cut off without an answer, like any slow request.
      if (statusOf(r.text) === 0 && r.ms >= 1900) { cut++; continue; }
      assertEq(statusOf(r.text), 413, `upload #${i} status after ${r.ms} ms (${r.text.slice(0, 120)})`);
    }
    const after = rss(strict);
    console.log(`     gateway RSS ${before.now.toFixed(0)} MiB before, ${after.now.toFixed(0)} MiB after, peak ${after.peak.toFixed(0)} MiB ` +
      `(8 x 100 MB uploads against --max-body-bytes 32 MiB; ${8 - cut} got 413, ${cut} cut off at the idle timeout)`);
    assert(after.peak < 1024, `peak RSS ${after.peak} MiB`);
    await stillServing(strict, 'after 100 MB bodies');
  }],
  ['slow-loris: 64 sockets dribbling headers or a body are cut off at --idle-timeout-s; others are served meanwhile', async ({ strict }) => {
    const dribble = (text, everyMs) => async (s) => {
      for (const ch of text) {
        if (s.destroyed) return;
        s.write(ch);
        await sleep(everyMs);
      }
    };
    const header = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: ${'p'.repeat(200)}\r\n`;
    const bodyLoris = CHAT_REQ(JSON.stringify({ ...VALID_CHAT, messages: [{ role: 'user', content: 'z'.repeat(400) }] }));
    const lorises = Array.from({ length: 64 }, (_, i) =>
      raw(port(strict), i % 2 ? dribble(header, 100) : async (s) => {
        s.write(bodyLoris.slice(0, bodyLoris.indexOf('\r\n\r\n') + 4));  // the headers at once, the body slowly
        await dribble(bodyLoris.slice(bodyLoris.indexOf('\r\n\r\n') + 4), 100)(s);
      }, { waitMs: 20000 }));
    await sleep(500);
    await stillServing(strict, 'during slow-loris');
    const results = await Promise.all(lorises);
    const slowest = Math.max(...results.map((r) => r.ms));
    for (const [i, r] of results.entries()) {
      assert(r.closedByServer, `loris #${i} was not closed by the server in 20 s`);
      assert(statusOf(r.text) !== 200, `loris #${i} got served`);
    }
    console.log(`     64 slow-loris sockets all closed by the gateway (--idle-timeout-s 2), the last after ${slowest} ms`);
    await inFlightDrains(strict, 'after slow-loris');
  }],
  ['half-closed connections: before, during and after a request; no hang, no leaked slot', async ({ strict }) => {
    const body = JSON.stringify(VALID_CHAT);
    const streamBody = JSON.stringify({ ...VALID_CHAT, stream: true, max_tokens: 200 });
    const p = port(strict);
    // The whole request, then our write side shut: the answer may come or the request may be taken as
    // abandoned; either way the server closes the connection.
    const full = await raw(p, CHAT_REQ(body), { halfClose: true });
    assert(full.closedByServer, 'whole request + half-close: closed by the server');
    assert([0, 200].includes(statusOf(full.text)), `whole request + half-close: ${full.text.slice(0, 120)}`);
    // Half the headers, or the headers and half the body, then EOF: the server closes at once.
    const halfHeader = await raw(p, 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le', { halfClose: true });
    // EOF closes at once; 5 s (8 s for the 2 s idle timeout below) are deadlines with room for a loaded machine.
    assert(halfHeader.closedByServer && halfHeader.ms < 5000, `half a header + EOF: closed after ${halfHeader.ms} ms`);
    const req = CHAT_REQ(body);
    const halfBody = await raw(p, req.slice(0, req.length - 10), { halfClose: true });
    assert(halfBody.closedByServer && halfBody.ms < 5000, `half a body + EOF: closed after ${halfBody.ms} ms`);
    assert([0, 400].includes(statusOf(halfBody.text)), `half a body + EOF: ${halfBody.text.slice(0, 120)}`);
    // A stream whose client shuts its write side after the first events: the request is aborted in the
    // mesh and its slot freed.
    const streamed = await raw(p, async (s) => {
      s.write(CHAT_REQ(streamBody));
      await new Promise((r) => s.once('data', r));
      s.end();
    });
    assert(streamed.closedByServer, 'stream + half-close: closed by the server');
    // Keep-alive: one answered request, then EOF between requests.
    const idle = await raw(p, CHAT_REQ(body), { halfClose: false, waitMs: 10000 });
    assertEq(statusOf(idle.text), 200, 'keep-alive request answered');
    assert(idle.closedByServer && idle.ms < 8000, `idle keep-alive closed at --idle-timeout-s (after ${idle.ms} ms)`);
    await inFlightDrains(strict, 'after half-closed connections');
    await stillServing(strict, 'after half-closed connections');
    const m = rss(strict);
    console.log(`     gateway peak RSS over the connection cases: ${m.peak.toFixed(0)} MiB`);
  }],
  ['still serving after the fuzz', async ({ mesh }) => {
    await stillServing(mesh, 'after the fuzz');
    await inFlightDrains(mesh, 'after the fuzz');
    console.log(`     statuses seen: ${JSON.stringify(counts)}; fuzzed gateway peak RSS ${rss(mesh).peak.toFixed(0)} MiB`);
  }],
];

await runCases(cases, {
  setup: async () => ({
    mesh: await startMesh({ stepMs: 1, extraGatewayArgs: ['--max-body-bytes', '1000000'] }),
    // Default body limit (32 MiB), short per-request timeout for the connection cases.
    strict: await startMesh({ stepMs: 5, extraGatewayArgs: ['--idle-timeout-s', '2'] }),
  }),
  teardown: async ({ mesh, strict }) => { await mesh.stop(); await strict.stop(); },
});

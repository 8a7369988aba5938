// Fuzzes the HTTP/JSON surface: random and truncated bodies, fields of the wrong type, huge numbers,
// invalid UTF-8, deep nesting, and malformed HTTP on a raw socket. Every answer must be a 4xx with an
// OpenAI error body (a 200 is allowed only for a body that is in fact a valid request), never a 5xx,
// a dropped connection on a well-formed HTTP request, or a crash; afterwards the gateway still serves.
// Deterministic (seeded PRNG) so a failure reproduces.
import net from 'node:net';
import { assert, assertEq, loadOpenAI, runCases, startMesh } from './harness.mjs';

const OpenAI = await loadOpenAI();
const MODEL = 'dsmesh-test';
let seed = 12345;
const rand = () => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x7fffffff; };
const pick = (a) => a[Math.floor(rand() * a.length)];

const VALID_CHAT = { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0,
  chat_template_kwargs: { thinking: false } };
const VALID_COMPLETION = { model: MODEL, prompt: 'hi', max_tokens: 4, temperature: 0 };
const WEIRD = [null, true, false, 0, -1, 1e308, -1e308, 1.5, 2 ** 31, 2 ** 53, -(2 ** 63), '', 'x', '\u0000', '💥', [], [1], [null],
  {}, { a: 1 }, 'a'.repeat(10000), [[[[]]]], 1e-300];
const FIELDS = ['model', 'messages', 'prompt', 'stream', 'stream_options', 'max_tokens', 'max_completion_tokens', 'temperature',
  'top_p', 'top_k', 'min_p', 'seed', 'stop', 'stop_token_ids', 'n', 'logprobs', 'top_logprobs', 'presence_penalty',
  'frequency_penalty', 'repetition_penalty', 'ignore_eos', 'response_format', 'tools', 'tool_choice', 'chat_template_kwargs',
  'reasoning_effort', 'priority', 'request_id', 'skip_special_tokens'];

async function post(base, path, body, contentType = 'application/json') {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': contentType }, body });
  const text = await r.text();
  return { status: r.status, text };
}

function checkAnswer(res, what, allowOk) {
  assert(res.status < 500, `${what}: got ${res.status}: ${res.text.slice(0, 300)}`);
  if (res.status === 200) {
    assert(allowOk, `${what}: got 200 for an invalid request`);
    return;
  }
  assert(res.status >= 400, `${what}: status ${res.status}`);
  let j;
  try { j = JSON.parse(res.text); } catch (e) { throw new Error(`${what}: error body is not JSON: ${res.text.slice(0, 200)}`); }
  assert(j.error && typeof j.error.message === 'string' && typeof j.error.type === 'string', `${what}: OpenAI error body`);
}

function rawHttp(port, data) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let got = '';
    s.on('data', (d) => { got += d.toString('latin1'); });
    s.on('error', () => resolve(got));
    s.on('close', () => resolve(got));
    s.write(data);
    setTimeout(() => s.end(), 300);
    setTimeout(() => { s.destroy(); resolve(got); }, 3000);
  });
}

const counts = {};
const count = (status) => { counts[status] = (counts[status] ?? 0) + 1; };

const cases = [
  ['wrong types and extreme values in every field', async ({ mesh }) => {
    for (const [path, valid] of [['/v1/chat/completions', VALID_CHAT], ['/v1/completions', VALID_COMPLETION]]) {
      for (const field of FIELDS) {
        for (const v of WEIRD) {
          const body = { ...valid, [field]: v };
          const res = await post(mesh.base, path, JSON.stringify(body));
          count(res.status);
          if (res.status === 200 && body.stream === true) continue;  // valid streaming request
          checkAnswer(res, `${path} ${field}=${JSON.stringify(v)?.slice(0, 40)}`, true);
        }
      }
    }
  }],
  ['random bytes, truncated JSON, invalid UTF-8, deep nesting, huge numbers', async ({ mesh }) => {
    const valid = JSON.stringify(VALID_CHAT);
    for (let i = 0; i < 300; i++) {
      const len = Math.floor(rand() * 400);
      const bytes = Buffer.from(Array.from({ length: len }, () => Math.floor(rand() * 256)));
      const res = await post(mesh.base, pick(['/v1/chat/completions', '/v1/completions', '/tokenize', '/detokenize']), bytes);
      count(res.status);
      checkAnswer(res, `random bytes #${i}`, false);
    }
    for (let cut = 0; cut < valid.length; cut += 3) {
      const res = await post(mesh.base, '/v1/chat/completions', valid.slice(0, cut));
      count(res.status);
      checkAnswer(res, `truncated at ${cut}`, false);
    }
    const specials = [
      Buffer.concat([Buffer.from('{"model":"dsmesh-test","messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc0, 0x80]), Buffer.from('"}]}')]),
      Buffer.concat([Buffer.from('{"prompt":"'), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('"}')]),
      '{"prompt":"\\ud800"}',
      '['.repeat(100000) + ']'.repeat(100000),
      '{"a":'.repeat(50000) + '1' + '}'.repeat(50000),
      '{"model":"dsmesh-test","prompt":"x","max_tokens":123456789012345678901234567890}',
      '{"model":"dsmesh-test","prompt":"x","seed":18446744073709551616}',
      '{"model":"dsmesh-test","prompt":"x","temperature":1e400}',
      '{"model":"dsmesh-test","prompt":"x","max_tokens":-0}',
      '{"model":"dsmesh-test","prompt":[]}',
      '{"model":"dsmesh-test","messages":[]}',
      '{"model":"dsmesh-test","messages":[{}]}',
      '{"model":"dsmesh-test","messages":[{"role":"user","content":[{"type":"image_url"}]}]}',
      '{"model":"dsmesh-test","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{not json"}}]}]}',
      '{"model":"dsmesh-test","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}',
      '"just a string"', 'null', '123', '{}', '{"model":"dsmesh-test","prompt":"x"}{"trailing":1}',
    ];
    for (const [i, body] of specials.entries()) {
      for (const path of ['/v1/chat/completions', '/v1/completions', '/tokenize']) {
        const res = await post(mesh.base, path, body);
        count(res.status);
        // /tokenize ignores sampling fields; #13 (non-JSON arguments in a past assistant call) is rendered
        // verbatim by the V4 encoder, so it may succeed.
        checkAnswer(res, `special #${i} on ${path}`, path === '/tokenize' || i === 13);
      }
    }
  }],
  ['malformed HTTP on a raw socket gets a 4xx, never a crash', async ({ mesh }) => {
    const port = Number(mesh.base.split(':').pop());
    const requests = [
      'GARBAGE\r\n\r\n',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{}',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n',
      `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(100000)}\r\n\r\n`,
      'GET /health HTTP/9.9\r\n\r\n',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{',  // body shorter than announced, then close
    ];
    for (const [i, req] of requests.entries()) {
      const answer = await rawHttp(port, req);
      const status = Number((answer.match(/^HTTP\/1\.[01] (\d{3})/) || [])[1] || 0);
      if (status) { count(status); assert(status >= 400 && status < 500, `raw #${i}: status ${status}`); }
    }
  }],
  ['still serving after the fuzz', async ({ mesh }) => {
    assertEq(mesh.gateway.exitCode, null, 'gateway process alive');
    assertEq((await fetch(`${mesh.base}/health`)).status, 200, 'health');
    const c = new OpenAI({ baseURL: mesh.url, apiKey: 'x', maxRetries: 0 });
    const r = await c.chat.completions.create(VALID_CHAT);
    assertEq(r.choices[0].message.content, 'hi', 'a normal request works');
    console.log(`     statuses seen: ${JSON.stringify(counts)}`);
  }],
];

await runCases(cases, {
  setup: async () => ({ mesh: await startMesh({ stepMs: 1, extraGatewayArgs: ['--max-body-bytes', '1000000'] }) }),
  teardown: async ({ mesh }) => mesh.stop(),
});

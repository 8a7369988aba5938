// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) driven by the official
// @anthropic-ai/sdk client (and raw fetch where the framing matters):
// - through `dsmesh up` on the shipped trained model (models/dsv4-small, one CPU worker, --api-key): plain,
//   streamed (the event order), thinking blocks, a tool-use round trip (tool_choice any / tool: a constrained
//   call), count_tokens, the error shape of bad requests, x-api-key and Bearer auth, Claude model names,
//   the vLLM metrics; its text is not meaningful, so the cases check shapes, not words;
// - through a gateway on the parrot fixture (the reply is the last user turn), for exact outputs: DSML
//   becoming a tool_use block with its input, thinking split from text, stop_sequences, ": ping" comments.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { ROOT, NODE_MODULES, assert, assertEq, freePort, metricsText, metricValue, rawStream, runCases, startMesh,
  track, waitHealthy } from './harness.mjs';

const { default: Anthropic } = await import(pathToFileURL(path.join(NODE_MODULES, '@anthropic-ai/sdk/index.mjs')).href);

const args = process.argv.slice(2);
const DSMESH = path.resolve(args[args.indexOf('--dsmesh') + 1]);
const KEY = 'sk-anthropic-test';
const SERVED = 'dsv4-small';
const CLAUDE = 'claude-sonnet-4-5';

async function startUp() {
  const port = await freePort();
  const up = track(spawn(DSMESH, ['up', '--model', path.join(ROOT, 'models/dsv4-small'), '--world', '1', '--port', String(port),
    '--kv-memory', '64M', '--max-num-seqs', '4', '--served-model-name', SERVED, '--api-key', KEY,
    '--log-dir', fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'up-'))], { stdio: ['ignore', 'ignore', 'pipe'] }), 'SIGINT');
  let log = '';
  up.stderr.on('data', (d) => { log += d; if (process.env.GATEWAY_TEST_VERBOSE) process.stderr.write(d); });
  const base = `http://127.0.0.1:${port}`;
  await waitHealthy(base, 120000).catch((e) => { throw new Error(`${e.message}\n${log}`); });
  return { base, async stop() { up.kill('SIGINT'); await new Promise((r) => { up.once('exit', r); setTimeout(r, 20000); }); } };
}

const client = (m, opts = {}) => new Anthropic({ baseURL: m.base, apiKey: KEY, maxRetries: 0, timeout: 300000, ...opts });
const ask = [{ role: 'user', content: "What does 'harbour' mean?" }];
const weather = { name: 'get_weather', description: 'Weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'], additionalProperties: false } };

// Content blocks without their tool_use ids (fresh for every request).
const noIds = (blocks) => blocks.map(({ id, ...b }) => b);

async function events(stream) {
  const out = [];
  for await (const e of stream) out.push(e);
  return out;
}

// Anthropic's stream grammar: message_start, then per block start / delta* / stop with indices 0, 1, ...,
// then one message_delta and message_stop. Returns the blocks assembled from the deltas.
function checkEventOrder(list) {
  assertEq(list[0].type, 'message_start', 'first event');
  assertEq(list[0].message.content, [], 'message_start has no content yet');
  assertEq(list[0].message.stop_reason, null, 'no stop_reason at message_start');
  const tail = list.slice(-2).map((e) => e.type);
  assertEq(tail, ['message_delta', 'message_stop'], 'closing events');
  const blocks = [];
  let open = null;
  for (const e of list.slice(1, -2)) {
    if (e.type === 'content_block_start') {
      assertEq(open, null, 'a block starts after the previous one stopped');
      assertEq(e.index, blocks.length, 'block indices count up');
      open = structuredClone(e.content_block);
      if (open.type === 'tool_use') open.json = '';
    } else if (e.type === 'content_block_delta') {
      assert(open && e.index === blocks.length, `delta of the open block ${JSON.stringify(e)}`);
      const d = e.delta;
      if (d.type === 'text_delta') { assertEq(open.type, 'text', 'text_delta in a text block'); open.text += d.text; }
      else if (d.type === 'thinking_delta') { assertEq(open.type, 'thinking', 'thinking_delta in a thinking block'); open.thinking += d.thinking; }
      else if (d.type === 'input_json_delta') { assertEq(open.type, 'tool_use', 'input_json_delta in a tool_use block'); open.json += d.partial_json; }
      else throw new Error(`unexpected delta ${JSON.stringify(d)}`);
    } else if (e.type === 'content_block_stop') {
      assert(open && e.index === blocks.length, 'stop of the open block');
      if (open.type === 'tool_use') { open.input = JSON.parse(open.json || '{}'); delete open.json; }
      blocks.push(open);
      open = null;
    } else {
      throw new Error(`unexpected event ${e.type} inside the message`);
    }
  }
  assertEq(open, null, 'every block stopped');
  return blocks;
}

function checkMessage(r, model) {
  assertEq(r.type, 'message', 'type');
  assertEq(r.role, 'assistant', 'role');
  assert(/^msg_/.test(r.id), `id ${r.id}`);
  assertEq(r.model, model, 'model echoed');
  assert(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(r.stop_reason), `stop_reason ${r.stop_reason}`);
  assert(Number.isInteger(r.usage.input_tokens) && r.usage.input_tokens >= 0, `usage ${JSON.stringify(r.usage)}`);
  assert(r.usage.input_tokens + r.usage.cache_read_input_tokens > 0, 'prompt tokens');
  assert(r.usage.output_tokens > 0, 'output tokens');
}

async function expectError(promise, status, type, re) {
  try {
    await promise;
  } catch (e) {
    assertEq(e.status, status, `status (${e.message})`);
    assertEq(e.error?.type, 'error', `body type (${JSON.stringify(e.error)})`);
    assertEq(e.error?.error?.type, type, `error type (${e.message})`);
    if (re) assert(re.test(e.error.error.message), `message ${e.error.error.message} matches ${re}`);
    return e;
  }
  throw new Error(`expected HTTP ${status}`);
}

const DSML_CALL = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n' +
  '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n' +
  '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>';

const cases = [
  ['plain message: a claude-* name is served by the loaded model; system as string and as blocks', async ({ up }) => {
    const r = await client(up).messages.create({ model: CLAUDE, max_tokens: 24, temperature: 0, system: 'You define words.', messages: ask });
    checkMessage(r, CLAUDE);
    assertEq(r.content.map((b) => b.type), ['text'], 'one text block');
    assert(r.content[0].text.length > 0, 'text');
    assert(r.usage.output_tokens <= 24, 'max_tokens bounds the output');
    if (r.stop_reason === 'max_tokens') assertEq(r.usage.output_tokens, 24, 'max_tokens reached');
    const blocks = await client(up).messages.create({ model: SERVED, max_tokens: 24, temperature: 0,
      system: [{ type: 'text', text: 'You define words.' }], messages: [{ role: 'user', content: [{ type: 'text', text: ask[0].content }] }] });
    checkMessage(blocks, SERVED);
    assertEq(blocks.content, r.content, 'the same prompt, whichever way it is written, gives the same greedy answer');
  }],

  ['streamed message: Anthropic\'s event order, ping, and the same answer as not streamed', async ({ up }) => {
    const req = { model: CLAUDE, max_tokens: 20, temperature: 0, messages: ask };
    const list = await events(await client(up).messages.create({ ...req, stream: true }));
    const blocks = checkEventOrder(list);
    const final = list[list.length - 2];
    assert(['end_turn', 'max_tokens'].includes(final.delta.stop_reason), `stop_reason ${final.delta.stop_reason}`);
    assert(final.usage.output_tokens > 0, 'usage on message_delta');
    const whole = await client(up).messages.create(req);
    assertEq(blocks, whole.content, 'streamed blocks = non-streamed content');
    assertEq(final.delta.stop_reason, whole.stop_reason, 'stop_reason');
    const acc = await client(up).messages.stream(req).finalMessage();  // the SDK's own accumulation
    assertEq(acc.content, whole.content, 'messages.stream().finalMessage()');
    // The raw stream: text/event-stream, a ping event right after message_start.
    const raw = await rawStream(`${up.base}/v1/messages`, { ...req, stream: true }, { 'x-api-key': KEY, 'anthropic-version': '2023-06-01' });
    assertEq(raw.status, 200, 'status');
    assert(raw.headers.get('content-type').startsWith('text/event-stream'), 'content type');
    const names = [...raw.text.matchAll(/^event: (\w+)$/gm)].map((m) => m[1]);
    assertEq(names.slice(0, 2), ['message_start', 'ping'], 'message_start, then ping');
    assert(/^data: \{"type":"ping"\}$/m.test(raw.text), 'ping event data');
  }],

  ['thinking enabled: V4 thinks into thinking blocks (streamed and not); disabled answers in text', async ({ up }) => {
    const req = { model: CLAUDE, max_tokens: 40, temperature: 0, messages: ask, thinking: { type: 'enabled', budget_tokens: 1024 } };
    const r = await client(up).messages.create(req);
    checkMessage(r, CLAUDE);
    assertEq(r.content[0].type, 'thinking', `first block ${JSON.stringify(r.content)}`);
    assert(r.content[0].thinking.length > 0, 'thinking text');
    assertEq(typeof r.content[0].signature, 'string', 'signature');
    if (r.content.length > 1) assertEq(r.content[1].type, 'text', 'the answer after the thinking');
    assert(r.usage.output_tokens_details.thinking_tokens > 0, 'thinking_tokens');
    const blocks = checkEventOrder(await events(await client(up).messages.create({ ...req, stream: true })));
    assertEq(blocks, r.content, 'streamed thinking = non-streamed');
    const off = await client(up).messages.create({ ...req, thinking: { type: 'disabled' } });
    assert(off.content.every((b) => b.type === 'text'), `no thinking when disabled: ${JSON.stringify(off.content)}`);
  }],

  ['tool use round trip: tool_choice any gives a tool_use block, its tool_result goes back', async ({ up }) => {
    const req = { model: CLAUDE, max_tokens: 96, temperature: 0, tools: [weather], tool_choice: { type: 'any', disable_parallel_tool_use: true },
      messages: [{ role: 'user', content: 'Weather in Oslo?' }] };
    const r = await client(up).messages.create(req);
    checkMessage(r, CLAUDE);
    assertEq(r.stop_reason, 'tool_use', 'stop_reason');
    const uses = r.content.filter((b) => b.type === 'tool_use');
    assertEq(uses.length, 1, `one tool_use: ${JSON.stringify(r.content)}`);
    assertEq(uses[0].name, 'get_weather', 'name');
    assert(typeof uses[0].id === 'string' && uses[0].id.length > 0, 'id');
    const { city, days } = uses[0].input;
    assert(typeof city === 'string' && city.length <= 12 && Number.isInteger(days) && days >= 1 && days <= 7, `input ${JSON.stringify(uses[0].input)}`);
    const blocks = checkEventOrder(await events(await client(up).messages.create({ ...req, stream: true })));
    assertEq(noIds(blocks), noIds(r.content), 'streamed input_json_delta = non-streamed input');
    const named = await client(up).messages.create({ ...req, tool_choice: { type: 'tool', name: 'get_weather' } });
    assertEq(named.content.filter((b) => b.type === 'tool_use').map((b) => b.name), ['get_weather'], 'named tool');
    const next = await client(up).messages.create({ model: CLAUDE, max_tokens: 12, temperature: 0, tools: [weather], messages: [
      ...req.messages, { role: 'assistant', content: r.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: '{"temp": 3}' }, { type: 'text', text: 'Summarize.' }] }] });
    checkMessage(next, CLAUDE);
    // tool_choice none: the tools stay out of the prompt.
    const none = await client(up).messages.countTokens({ model: CLAUDE, tools: [weather], tool_choice: { type: 'none' }, messages: req.messages });
    const bare = await client(up).messages.countTokens({ model: CLAUDE, messages: req.messages });
    assertEq(none.input_tokens, bare.input_tokens, 'tool_choice none renders without tools');
  }],

  ['count_tokens: the prompt /v1/messages renders, tools and thinking included', async ({ up }) => {
    const body = { model: CLAUDE, system: 'You define words.', messages: ask, tools: [weather] };
    const n = await client(up).messages.countTokens(body);
    assert(Number.isInteger(n.input_tokens) && n.input_tokens > 0, `input_tokens ${JSON.stringify(n)}`);
    const r = await client(up).messages.create({ ...body, max_tokens: 1, temperature: 0 });
    assertEq(n.input_tokens, r.usage.input_tokens + r.usage.cache_read_input_tokens, 'count = the prompt create used');
    const withoutTools = await client(up).messages.countTokens({ model: CLAUDE, system: 'You define words.', messages: ask });
    assert(withoutTools.input_tokens < n.input_tokens, 'tools are part of the prompt');
  }],

  ['errors in Anthropic\'s shape with Anthropic\'s statuses', async ({ up }) => {
    const c = client(up);
    // The SDK types max_tokens as required; a client that forgets it gets Anthropic's 400.
    await expectError(c.messages.create({ model: CLAUDE, messages: ask }), 400, 'invalid_request_error', /max_tokens/);
    await expectError(c.messages.create({ model: CLAUDE, max_tokens: 8, messages: [] }), 400, 'invalid_request_error', /messages/);
    await expectError(c.messages.create({ model: CLAUDE, max_tokens: 8, messages: ask, thinking: { type: 'enabled', budget_tokens: 10 } }),
      400, 'invalid_request_error', /budget_tokens/);
    await expectError(c.messages.create({ model: CLAUDE, max_tokens: 8, messages: ask, temperature: 3 }), 400, 'invalid_request_error', /temperature/);
    await expectError(c.messages.create({ model: 'gpt-4o', max_tokens: 8, messages: ask }), 404, 'not_found_error', /gpt-4o/);
    await expectError(c.messages.create({ model: CLAUDE, max_tokens: 1 << 30, messages: ask, stream: true }), 400, 'invalid_request_error');
    const e = await expectError(c.messages.create({ model: CLAUDE, max_tokens: 8, messages: [{ role: 'user', content: [{ type: 'document', source: {} }] }] }),
      400, 'invalid_request_error', /messages\.0\.content\.0\.type/);
    assert(/^req_/.test(e.requestID ?? e.error.request_id), `request id ${e.requestID} / ${e.error.request_id}`);
    // Raw: the body is exactly Anthropic's error object.
    const r = await fetch(`${up.base}/v1/messages`, { method: 'POST', headers: { 'x-api-key': KEY, 'content-type': 'application/json' }, body: '{"model":' });
    assertEq(r.status, 400, 'malformed JSON');
    const body = await r.json();
    assertEq(Object.keys(body).sort(), ['error', 'request_id', 'type'], 'error body keys');
    assertEq(body.type, 'error', 'type');
    assertEq(body.error.type, 'invalid_request_error', 'error.type');
  }],

  ['auth: x-api-key or Bearer; anthropic-version / anthropic-beta accepted; a wrong key is authentication_error', async ({ up }) => {
    const viaHeader = new Anthropic({ baseURL: up.base, apiKey: null, authToken: null, maxRetries: 0,
      defaultHeaders: { 'x-api-key': KEY, 'anthropic-beta': 'interleaved-thinking-2025-05-14' } });
    checkMessage(await viaHeader.messages.create({ model: CLAUDE, max_tokens: 4, messages: ask }), CLAUDE);
    checkMessage(await client(up).messages.create({ model: CLAUDE, max_tokens: 4, messages: ask }), CLAUDE);  // Bearer
    const wrong = new Anthropic({ baseURL: up.base, apiKey: null, authToken: null, maxRetries: 0, defaultHeaders: { 'x-api-key': 'nope' } });
    await expectError(wrong.messages.create({ model: CLAUDE, max_tokens: 4, messages: ask }), 401, 'authentication_error');
    await expectError(wrong.messages.countTokens({ model: CLAUDE, messages: ask }), 401, 'authentication_error');
    const none = await fetch(`${up.base}/v1/messages`, { method: 'POST', body: JSON.stringify({ model: CLAUDE, max_tokens: 4, messages: ask }) });
    assertEq(none.status, 401, 'no key');
    assertEq((await none.json()).error.type, 'authentication_error', 'no key: type');
  }],

  ['same engine, same metrics: /v1/messages requests count in vllm:* and dsmesh_http_requests_total', async ({ up }) => {
    const m = async () => metricsText(up.base);
    const name = `vllm:request_success_total{model_name="${SERVED}",engine="0",finished_reason="length"}`;
    const before = metricValue(await m(), name) ?? 0;
    const http = 'dsmesh_http_requests_total{handler="/v1/messages",method="POST",status="200"}';
    const httpBefore = metricValue(await m(), http) ?? 0;
    await client(up).messages.create({ model: CLAUDE, max_tokens: 3, messages: ask });
    await client(up).messages.create({ model: CLAUDE, max_tokens: 3, messages: ask, stream: true }).then(events);
    const text = await m();
    assertEq(metricValue(text, name), before + 2, 'two requests finished by length');
    assertEq(metricValue(text, http), httpBefore + 2, 'http requests by handler');
  }],

  ['parrot: DSML output is a tool_use block with its exact input (streamed and not); the tool_result goes back', async ({ parrot }) => {
    const req = { model: 'dsmesh-test', max_tokens: 512, temperature: 0, tools: [weather], messages: [{ role: 'user', content: DSML_CALL }] };
    const r = await client(parrot).messages.create(req);
    assertEq(r.stop_reason, 'tool_use', 'stop_reason');
    const use = r.content.find((b) => b.type === 'tool_use');
    assertEq([use.name, use.input], ['get_weather', { city: 'Paris', days: 3 }], 'the call');
    const blocks = checkEventOrder(await events(await client(parrot).messages.create({ ...req, stream: true })));
    assertEq(noIds(blocks), noIds(r.content), 'streamed = non-streamed');
    const next = await client(parrot).messages.create({ ...req, messages: [...req.messages, { role: 'assistant', content: r.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: [{ type: 'text', text: '21 C' }] }, { type: 'text', text: 'Thanks.' }] }] });
    checkMessage(next, 'dsmesh-test');
    assertEq(next.content.map((b) => b.type), ['text'], 'a text answer after the tool result');
    assert(next.content[0].text.endsWith('Thanks.'), `echoes the last user turn: ${JSON.stringify(next.content)}`);
  }],

  ['parrot: thinking text splits at </think>; stop_sequences end with stop_sequence', async ({ parrot }) => {
    const r = await client(parrot).messages.create({ model: 'dsmesh-test', max_tokens: 512, temperature: 0, thinking: { type: 'enabled', budget_tokens: 2048 },
      messages: [{ role: 'user', content: 'Let me think.</think>The answer is 42.' }] });
    assertEq(r.content.map((b) => [b.type, b.thinking ?? b.text]), [['thinking', 'Let me think.'], ['text', 'The answer is 42.']], 'blocks');
    assertEq(r.stop_reason, 'end_turn', 'end_turn');
    const s = await client(parrot).messages.create({ model: 'dsmesh-test', max_tokens: 512, temperature: 0, stop_sequences: ['STOP'],
      messages: [{ role: 'user', content: 'one two STOP three' }] });
    assertEq([s.stop_reason, s.stop_sequence, s.content[0].text], ['stop_sequence', 'STOP', 'one two '], 'stopped');
  }],

  ['parrot: a silent stream gets ": ping" comments the SDK ignores', async ({ sleepy }) => {
    const body = { model: 'dsmesh-test', max_tokens: 2, temperature: 0, stream: true, messages: [{ role: 'user', content: 'one two three' }] };
    const raw = await rawStream(`${sleepy.base}/v1/messages`, body);
    assert(raw.text.includes('\n\n: ping\n\n'), `ping comment in ${JSON.stringify(raw.text.slice(0, 400))}`);
    const list = await events(await client(sleepy).messages.create(body));
    assertEq(list[list.length - 2].delta.stop_reason, 'max_tokens', 'the SDK parsed the stream');
  }],
];

await runCases(cases, {
  setup: async () => ({
    up: await startUp(),
    parrot: await startMesh(),
    sleepy: await startMesh({ stepMs: 1300, extraGatewayArgs: ['--sse-ping-s', '1'] }),
  }),
  teardown: async (ctx) => { for (const m of Object.values(ctx)) await m.stop(); },
});

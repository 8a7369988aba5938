// The gateway driven by the official `openai` npm client (and raw fetch where byte-level framing
// matters), against the parrot Generate fixture: the reply is whatever the last user message says,
// so each case scripts the "model output" and checks how the gateway turns it into OpenAI objects.
import { assert, assertEq, loadOpenAI, metricsText, metricValue, rawStream, runCases, startMesh } from './harness.mjs';

import fs from 'node:fs';

const OpenAI = await loadOpenAI();
// PNG's CRC-32 (to rewrite an IHDR and keep its chunk valid).
function pngCrc32(bytes) {
  let crc = 0xffffffff;
  for (const b of bytes) {
    crc ^= b;
    for (let k = 0; k < 8; k++) crc = (crc >>> 1) ^ (0xedb88320 & -(crc & 1));
  }
  return (crc ^ 0xffffffff) >>> 0;
}
const MODEL = 'dsmesh-test';

const client = (mesh, opts = {}) => validated(new OpenAI({ baseURL: mesh.url, apiKey: opts.apiKey ?? 'unused', maxRetries: 0, ...opts }));

async function tokenCount(mesh, text) {
  const r = await fetch(`${mesh.base}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: text, add_special_tokens: false }) });
  const j = await r.json();
  return j.count;
}

// Structural checks of what the client parsed, field by field as the OpenAI API reference defines
// the objects (the npm client only types them, it does not validate at run time).
const FINISH = new Set(['stop', 'length', 'tool_calls', 'content_filter', 'function_call']);
function checkUsage(u, where) {
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens'])
    assert(Number.isInteger(u[k]) && u[k] >= 0, `${where}.usage.${k} is a non-negative integer`);
  assertEq(u.total_tokens, u.prompt_tokens + u.completion_tokens, `${where}.usage.total_tokens`);
}
function checkToolCalls(calls, where, streaming) {
  assert(Array.isArray(calls), `${where}.tool_calls is an array`);
  for (const tc of calls) {
    if (streaming) assert(Number.isInteger(tc.index), `${where}.tool_calls[].index`);
    if (!streaming || tc.id !== undefined) {
      assert(typeof tc.id === 'string' && tc.id.length > 0, `${where}.tool_calls[].id`);
      assertEq(tc.type, 'function', `${where}.tool_calls[].type`);
    }
    assert(typeof tc.function === 'object', `${where}.tool_calls[].function`);
    if (!streaming) assert(typeof tc.function.name === 'string' && typeof tc.function.arguments === 'string', `${where} function name/arguments`);
  }
}
function checkCommon(o, object, where) {
  assert(typeof o.id === 'string' && o.id.length > 0, `${where}.id`);
  assertEq(o.object, object, `${where}.object`);
  assert(Number.isInteger(o.created) && Math.abs(o.created - Date.now() / 1000) < 600, `${where}.created is a recent unix time`);
  assertEq(o.model, MODEL, `${where}.model`);
  assert(Array.isArray(o.choices), `${where}.choices`);
}
function validateChatCompletion(r, n = 1) {
  checkCommon(r, 'chat.completion', 'chat.completion');
  assertEq(r.choices.length, n, 'n choices');
  r.choices.forEach((c, i) => validateChatChoice(c, i));
  checkUsage(r.usage, 'chat.completion');
}
function validateChatChoice(c, i) {
  assertEq(c.index, i, 'choice.index');
  assert(FINISH.has(c.finish_reason), `finish_reason ${c.finish_reason}`);
  assertEq(c.message.role, 'assistant', 'message.role');
  assert(c.message.content === null || typeof c.message.content === 'string', 'message.content');
  if (c.message.tool_calls) checkToolCalls(c.message.tool_calls, 'message', false);
  assert(c.logprobs === null || Array.isArray(c.logprobs.content), 'choice.logprobs');
}
function validateChunk(c, object = 'chat.completion.chunk', n = 1) {
  checkCommon(c, object, object);
  for (const ch of c.choices) {
    assert(Number.isInteger(ch.index) && ch.index >= 0 && ch.index < n, `chunk choice index ${ch.index} of n ${n}`);
    assert(ch.finish_reason === null || FINISH.has(ch.finish_reason), `chunk finish_reason ${ch.finish_reason}`);
    if (object === 'chat.completion.chunk') {
      assert(typeof ch.delta === 'object', 'delta');
      if (ch.delta.role !== undefined) assertEq(ch.delta.role, 'assistant', 'delta.role');
      for (const k of ['content', 'reasoning_content'])
        if (ch.delta[k] !== undefined) assert(typeof ch.delta[k] === 'string', `delta.${k}`);
      if (ch.delta.tool_calls) checkToolCalls(ch.delta.tool_calls, 'delta', true);
    } else {
      assert(typeof ch.text === 'string', 'completion chunk text');
    }
  }
  if (c.usage) checkUsage(c.usage, object);
  if (!c.choices.length) assert(c.usage, 'a chunk without choices is the usage chunk');
}
function validateCompletion(r, n = 1) {
  checkCommon(r, 'text_completion', 'text_completion');
  assertEq(r.choices.length, n, 'n choices');
  r.choices.forEach((c, i) => {
    assertEq(c.index, i, 'choice.index');
    assert(typeof c.text === 'string' && FINISH.has(c.finish_reason), 'completion choice');
  });
  checkUsage(r.usage, 'text_completion');
}

// Every object the client returns goes through the validators above.
function validated(c) {
  const wrap = (create, whole, chunkObject) => async (body, opts) => {
    const res = await create(body, opts);
    const n = body?.n ?? 1;
    if (res && typeof res[Symbol.asyncIterator] === 'function') {
      return (async function* () { for await (const ch of res) { validateChunk(ch, chunkObject, n); yield ch; } })();
    }
    whole(res, n);
    return res;
  };
  const chatCreate = c.chat.completions.create.bind(c.chat.completions);
  const complCreate = c.completions.create.bind(c.completions);
  c.chat.completions.create = (body, opts) => {
    const p = chatCreate(body, opts);
    const out = wrap(() => p, validateChatCompletion, 'chat.completion.chunk')(body, opts);
    out.withResponse = async () => { const r = await p.withResponse(); validateChatCompletion(r.data, body?.n ?? 1); return r; };
    return out;
  };
  c.completions.create = (body, opts) => wrap(complCreate, validateCompletion, 'text_completion')(body, opts);
  return c;
}

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

const DSML_CALL = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n' +
  '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n' +
  '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>';
const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } } }];

async function expectError(promise, status, re) {
  try {
    await promise;
  } catch (e) {
    assertEq(e.status, status, `status of ${e.message}`);
    if (re) assert(re.test(e.message), `error message ${JSON.stringify(e.message)} matches ${re}`);
    assert(e.error && typeof e.error.message === 'string', 'OpenAI error body has error.message');
    return e;
  }
  throw new Error(`expected HTTP ${status}, got success`);
}

const cases = [
  ['models lists the served model', async ({ mesh }) => {
    const list = await client(mesh).models.list();
    assertEq(list.data.map((m) => m.id), [MODEL], 'model ids');
    assertEq(list.data[0].object, 'model', 'object');
    const one = await client(mesh).models.retrieve(MODEL);
    assertEq(one.id, MODEL, 'retrieve');
    await expectError(client(mesh).models.retrieve('nope'), 404);
    // vLLM's card: max_model_len, root (the model as loaded), parent, one model_permission entry.
    const card = (await (await fetch(`${mesh.url}/models`)).json()).data[0];
    assertEq(card.max_model_len, 4096, 'max_model_len');
    assert(typeof card.root === 'string' && card.root.length > 0, `root ${card.root}`);
    assertEq(card.parent, null, 'parent');
    assertEq(card.permission.length, 1, 'permission');
    assertEq([card.permission[0].object, card.permission[0].allow_sampling, card.permission[0].organization],
             ['model_permission', true, '*'], 'permission entry');
    assertEq(one, card, 'retrieve = the list entry');
  }],

  ['GET /version answers vLLM\'s shape; other methods are 405', async ({ mesh }) => {
    const r = await fetch(`${mesh.base}/version`);
    assertEq(r.status, 200, 'status');
    const v = await r.json();
    assertEq(Object.keys(v), ['version'], 'keys');
    assert(/^\d+\.\d+\.\d+/.test(v.version), `version ${v.version}`);
    assertEq((await fetch(`${mesh.base}/version`, { method: 'POST' })).status, 405, 'POST /version');
  }],

  ['chat: reasoning_content, content, usage from engine counts', async ({ mesh }) => {
    const said = 'Let me think about it.</think>The answer is 42.';
    const r = await client(mesh).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: said }], temperature: 0 });
    assertEq(r.object, 'chat.completion', 'object');
    assert(r.id.startsWith('chatcmpl-'), 'id prefix');
    const m = r.choices[0].message;
    assertEq(m.role, 'assistant', 'role');
    assertEq(m.reasoning_content, 'Let me think about it.', 'reasoning_content');
    assertEq(m.content, 'The answer is 42.', 'content');
    assertEq(r.choices[0].finish_reason, 'stop', 'finish_reason');
    // The parrot emits the user text's tokens, then EOS: the engine counted len + 1.
    assertEq(r.usage.completion_tokens, (await tokenCount(mesh, said)) + 1, 'completion_tokens');
    const tk = await (await fetch(`${mesh.base}/tokenize`, { method: 'POST', body: JSON.stringify({ messages: [{ role: 'user', content: said }] }) })).json();
    assertEq(r.usage.prompt_tokens, tk.count, 'prompt_tokens = /tokenize of the messages');
    assertEq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, 'total');
  }],

  ['chat stream: role first, deltas, include_usage chunk, SSE framing', async ({ mesh }) => {
    const said = 'Thinking step.</think>Streaming works fine.';
    const body = { model: MODEL, messages: [{ role: 'user', content: said }], stream: true, stream_options: { include_usage: true }, temperature: 0 };
    const chunks = await collect(await client(mesh).chat.completions.create(body));
    assertEq(chunks[0].choices[0].delta.role, 'assistant', 'first chunk carries the role');
    let reasoning = '', content = '', finish = null;
    for (const c of chunks) {
      assertEq(c.object, 'chat.completion.chunk', 'chunk object');
      for (const ch of c.choices) {
        reasoning += ch.delta.reasoning_content ?? '';
        content += ch.delta.content ?? '';
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    assertEq(reasoning, 'Thinking step.', 'streamed reasoning');
    assertEq(content, 'Streaming works fine.', 'streamed content');
    assertEq(finish, 'stop', 'finish_reason');
    const last = chunks[chunks.length - 1];
    assertEq(last.choices, [], 'usage chunk has empty choices');
    assertEq(last.usage.completion_tokens, (await tokenCount(mesh, said)) + 1, 'usage from engine counts');
    for (const c of chunks.slice(0, -1)) assertEq(c.usage, null, 'usage null before the last chunk');
    const raw = await rawStream(`${mesh.url}/chat/completions`, body);
    assertEq(raw.status, 200, 'status');
    assert(raw.headers.get('content-type').startsWith('text/event-stream'), 'content-type');
    const events = raw.text.split('\n\n');
    assertEq(events.pop(), '', 'stream ends with a blank line');
    assertEq(events.pop(), 'data: [DONE]', 'last event is [DONE]');
    for (const e of events) {
      assert(e.startsWith('data: {') && !e.includes('\n'), `event framing: ${JSON.stringify(e.slice(0, 80))}`);
      JSON.parse(e.slice(6));
    }
  }],

  ['usage counts tokens, not chunks (several tokens per engine step)', async ({ spec }) => {
    const said = 'one two three four five six seven eight nine ten eleven twelve';
    const chunks = await collect(await client(spec).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: said }],
      stream: true, stream_options: { include_usage: true }, chat_template_kwargs: { thinking: false } }));
    const contentChunks = chunks.filter((c) => c.choices.length && c.choices[0].delta.content).length;
    const usage = chunks[chunks.length - 1].usage;
    assertEq(usage.completion_tokens, (await tokenCount(spec, said)) + 1, 'completion tokens');
    assert(contentChunks < usage.completion_tokens, `fewer chunks (${contentChunks}) than tokens (${usage.completion_tokens})`);
  }],

  ['chat with thinking off: everything is content', async ({ mesh }) => {
    const r = await client(mesh).chat.completions.create({ model: MODEL, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there.' }], temperature: 0,
      chat_template_kwargs: { thinking: false } });
    assertEq(r.choices[0].message.content, 'Hello there.', 'content');
    assert(!r.choices[0].message.reasoning_content, 'no reasoning');
  }],

  ['stop strings (non-stream and stream), stop_reason', async ({ mesh }) => {
    const messages = [{ role: 'user', content: 'alpha beta gamma delta' }];
    const r = await client(mesh).chat.completions.create({ model: MODEL, messages, stop: ['gamma'], temperature: 0, chat_template_kwargs: { thinking: false } });
    assertEq(r.choices[0].message.content, 'alpha beta ', 'text before the stop string');
    assertEq(r.choices[0].finish_reason, 'stop', 'finish_reason');
    assertEq(r.choices[0].stop_reason, 'gamma', 'stop_reason');
    const chunks = await collect(await client(mesh).chat.completions.create({ model: MODEL, messages, stop: 'delta', stream: true, temperature: 0, chat_template_kwargs: { thinking: false } }));
    assertEq(chunks.map((c) => c.choices[0]?.delta.content ?? '').join(''), 'alpha beta gamma ', 'streamed text before stop');
    assertEq(chunks[chunks.length - 1].choices[0].finish_reason, 'stop', 'stream finish_reason');
  }],

  ['n: 2 with stop strings: each choice stops on its own (non-stream and stream), usage sums', async ({ mesh }) => {
    const messages = [{ role: 'user', content: 'alpha beta gamma delta' }];
    const r = await client(mesh).chat.completions.create({ model: MODEL, messages, n: 2, stop: ['gamma'], temperature: 0, chat_template_kwargs: { thinking: false } });
    assertEq(r.choices.map((c) => [c.index, c.message.content, c.finish_reason, c.stop_reason]),
      [[0, 'alpha beta ', 'stop', 'gamma'], [1, 'alpha beta ', 'stop', 'gamma']], 'choices');
    const chunks = await collect(await client(mesh).chat.completions.create({ model: MODEL, messages, n: 2, stop: 'delta', stream: true,
      stream_options: { include_usage: true }, temperature: 0, chat_template_kwargs: { thinking: false } }));
    const text = ['', ''], finish = [null, null];
    for (const c of chunks) for (const ch of c.choices) { text[ch.index] += ch.delta.content ?? ''; if (ch.finish_reason) finish[ch.index] = ch.finish_reason; }
    assertEq(text, ['alpha beta gamma ', 'alpha beta gamma '], 'streamed text per choice');
    assertEq(finish, ['stop', 'stop'], 'finish per choice');
    const usage = chunks[chunks.length - 1].usage;
    const one = await client(mesh).chat.completions.create({ model: MODEL, messages, stop: 'delta', temperature: 0, chat_template_kwargs: { thinking: false } });
    assertEq(usage.completion_tokens, 2 * one.usage.completion_tokens, 'usage counts both choices');
  }],

  ['max_tokens and max_completion_tokens -> length', async ({ mesh }) => {
    const messages = [{ role: 'user', content: 'a b c d e f g h i j k l m n o p' }];
    const r = await client(mesh).chat.completions.create({ model: MODEL, messages, max_tokens: 3, temperature: 0, chat_template_kwargs: { thinking: false } });
    assertEq(r.choices[0].finish_reason, 'length', 'finish_reason');
    assertEq(r.usage.completion_tokens, 3, 'completion tokens');
    const r2 = await client(mesh).chat.completions.create({ model: MODEL, messages, max_completion_tokens: 5, chat_template_kwargs: { thinking: false } });
    assertEq(r2.usage.completion_tokens, 5, 'max_completion_tokens');
  }],

  ['seeds: same seed same output, other seed other output', async ({ mesh }) => {
    const messages = [{ role: 'user', content: 'the quick brown fox jumps over the lazy dog again and again' }];
    const run = async (seed) => (await client(mesh).chat.completions.create({ model: MODEL, messages, temperature: 0.9, seed, chat_template_kwargs: { thinking: false } })).choices[0].message.content;
    const a = await run(7), b = await run(7), c = await run(8);
    assertEq(a, b, 'same seed');
    assert(a !== c, 'different seed gives different output');
  }],

  ['tools: DSML output becomes tool_calls (non-stream and stream)', async ({ mesh }) => {
    const messages = [{ role: 'user', content: `I will check.${DSML_CALL}` }];
    const r = await client(mesh).chat.completions.create({ model: MODEL, messages, tools: TOOLS, temperature: 0, chat_template_kwargs: { thinking: false } });
    const ch = r.choices[0];
    assertEq(ch.finish_reason, 'tool_calls', 'finish_reason');
    assertEq(ch.message.content, 'I will check.', 'content before the call');
    assertEq(ch.message.tool_calls.length, 1, 'one call');
    assertEq(ch.message.tool_calls[0].type, 'function', 'type');
    assertEq(ch.message.tool_calls[0].function.name, 'get_weather', 'name');
    assertEq(JSON.parse(ch.message.tool_calls[0].function.arguments), { city: 'Paris', days: 3 }, 'arguments');
    assert(ch.message.tool_calls[0].id.length > 0, 'call id');
    const chunks = await collect(await client(mesh).chat.completions.create({ model: MODEL, messages, tools: TOOLS, stream: true, temperature: 0, chat_template_kwargs: { thinking: false } }));
    let name = '', args = '', id = '', finish = null;
    for (const c of chunks) for (const choice of c.choices) {
      for (const tc of choice.delta.tool_calls ?? []) { name += tc.function?.name ?? ''; args += tc.function?.arguments ?? ''; id += tc.id ?? ''; }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    assertEq(name, 'get_weather', 'streamed name');
    assertEq(JSON.parse(args), { city: 'Paris', days: 3 }, 'streamed arguments');
    assert(id.startsWith('call_'), 'streamed id');
    assertEq(finish, 'tool_calls', 'streamed finish_reason');
    // The conversation continues with the tool result (renders; parrot answers the last user turn).
    const r3 = await client(mesh).chat.completions.create({ model: MODEL, tools: TOOLS, chat_template_kwargs: { thinking: false }, messages: [
      ...messages, ch.message, { role: 'tool', tool_call_id: ch.message.tool_calls[0].id, content: '{"temp": 21}' }] });
    assertEq(r3.object, 'chat.completion', 'tool round trip accepted');
  }],

  // The hard V4 outputs, scripted through the parrot (the user text is the model's output), each
  // non-streamed and streamed (one token per step on `mesh`, three on `spec`): the streamed pieces must
  // add up to the non-streamed message.
  ['hard V4 outputs: unclosed reasoning, a call inside reasoning, parallel calls, DSML text in arguments', async ({ mesh, spec }) => {
    const param = (k, str, v) => `<｜DSML｜parameter name="${k}" string="${str}">${v}</｜DSML｜parameter>\n`;
    const invoke = (name, params) => `<｜DSML｜invoke name="${name}">\n${params}</｜DSML｜invoke>\n`;
    const block = (...invokes) => `\n\n<｜DSML｜tool_calls>\n${invokes.join('')}</｜DSML｜tool_calls>`;
    const tricky = 'a value ends at </｜DSML｜parameter> and <｜DSML｜invoke name="x"> opens a call';
    const scripts = [
      { name: 'reasoning never closed, cut by max_tokens', said: 'Weighing 東京 🧠 against Zürich, one step at a time, then the next step and more',
        max_tokens: 12, want: (m, said) => {
          assert(m.reasoning_content.length > 0 && said.startsWith(m.reasoning_content), `reasoning is a prefix: ${m.reasoning_content}`);
          assertEq(m.content, null, 'no content');
          assertEq(m.tool_calls ?? [], [], 'no calls');
        }, finish: 'length' },
      { name: 'call inside reasoning', said: `I should look it up.${block(invoke('get_weather', param('city', true, 'Paris') + param('days', false, '3')))}`,
        want: (m) => {
          assertEq(m.reasoning_content, 'I should look it up.', 'reasoning before the block');
          assertEq(m.content, null, 'no content');
          assertEq(m.tool_calls.map((t) => [t.function.name, JSON.parse(t.function.arguments)]), [['get_weather', { city: 'Paris', days: 3 }]], 'the call');
        }, finish: 'tool_calls' },
      { name: 'parallel calls with DSML text in an argument', said: `Two.</think>Checking both.${block(
        invoke('get_weather', param('city', true, '東京') + param('days', false, '2')),
        invoke('get_weather', param('city', true, tricky)))}`,
        want: (m) => {
          assertEq(m.reasoning_content, 'Two.', 'reasoning');
          assertEq(m.content, 'Checking both.', 'content');
          assertEq(m.tool_calls.map((t) => JSON.parse(t.function.arguments)), [{ city: '東京', days: 2 }, { city: tricky }], 'arguments');
          assert(new Set(m.tool_calls.map((t) => t.id)).size === 2, 'distinct ids');
        }, finish: 'tool_calls' },
    ];
    for (const s of scripts) {
      for (const m of [mesh, spec]) {
        const body = { model: MODEL, messages: [{ role: 'user', content: s.said }], tools: TOOLS, temperature: 0,
          ...(s.max_tokens ? { max_tokens: s.max_tokens } : {}) };
        const r = await client(m).chat.completions.create(body);
        s.want(r.choices[0].message, s.said);
        assertEq(r.choices[0].finish_reason, s.finish, `${s.name}: finish_reason`);
        const chunks = await collect(await client(m).chat.completions.create({ ...body, stream: true }));
        let reasoning = '', content = '', finish = null;
        const calls = [];
        for (const c of chunks) for (const ch of c.choices) {
          reasoning += ch.delta.reasoning_content ?? '';
          content += ch.delta.content ?? '';
          for (const tc of ch.delta.tool_calls ?? []) {
            calls[tc.index] ??= { name: '', arguments: '' };
            calls[tc.index].name += tc.function?.name ?? '';
            calls[tc.index].arguments += tc.function?.arguments ?? '';
          }
          if (ch.finish_reason) finish = ch.finish_reason;
        }
        const msg = r.choices[0].message;
        assertEq(reasoning, msg.reasoning_content ?? '', `${s.name}: streamed reasoning`);
        assertEq(content, msg.content ?? '', `${s.name}: streamed content`);
        assertEq(calls, (msg.tool_calls ?? []).map((t) => ({ name: t.function.name, arguments: t.function.arguments })), `${s.name}: streamed calls`);
        assertEq(finish, s.finish, `${s.name}: streamed finish_reason`);
      }
    }
  }],

  // tool_choice "none", or no tools: the model may write DSML anyway (it saw calls in the history). No call
  // comes back and no DSML text: the block is removed, the text around it is the content. A malformed block
  // with tools is content, as written. Both are counted in /metrics.
  ['tool_choice none and no tools: DSML is removed, never content; malformed blocks are content; both counted', async ({ mesh }) => {
    const LBL = '{model_name="dsmesh-test",engine="0"}';
    const counters = async () => {
      const t = await metricsText(mesh.base);
      return [metricValue(t, `dsmesh_suppressed_tool_calls_total${LBL}`), metricValue(t, `dsmesh_malformed_tool_call_blocks_total${LBL}`)];
    };
    // A request is counted when it finishes, which may be a moment after its last byte reached the client.
    const waitFor = async (want) => {
      let got;
      for (let i = 0; i < 50; ++i) {
        got = await counters();
        if (got[0] === want[0] && got[1] === want[1]) return;
        await new Promise((r) => setTimeout(r, 20));
      }
      assertEq(got, want, 'suppressed calls, malformed blocks');
    };
    const [suppressed0, malformed0] = await counters();
    const said = `I will check.${DSML_CALL} Done.`;
    for (const extra of [{ tools: TOOLS, tool_choice: 'none' }, {}]) {
      const body = { model: MODEL, messages: [{ role: 'user', content: said }], temperature: 0, chat_template_kwargs: { thinking: false }, ...extra };
      const r = await client(mesh).chat.completions.create(body);
      assertEq(r.choices[0].message.content, 'I will check. Done.', 'content without the block');
      assertEq(r.choices[0].message.tool_calls ?? [], [], 'no calls');
      assertEq(r.choices[0].finish_reason, 'stop', 'finish_reason');
      const chunks = await collect(await client(mesh).chat.completions.create({ ...body, stream: true }));
      let content = '', finish = null;
      for (const c of chunks) for (const ch of c.choices) {
        content += ch.delta.content ?? '';
        assert(!ch.delta.tool_calls?.length, 'no streamed calls');
        if (ch.finish_reason) finish = ch.finish_reason;
      }
      assertEq(content, 'I will check. Done.', 'streamed content without the block');
      assertEq(finish, 'stop', 'streamed finish_reason');
    }
    await waitFor([suppressed0 + 4, malformed0]);
    const broken = 'Answer.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n' +
      '<｜DSML｜parameter name="days" string="false">three</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>';
    const r = await client(mesh).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: broken }], tools: TOOLS,
      temperature: 0, chat_template_kwargs: { thinking: false } });
    assertEq(r.choices[0].message.content, broken, 'a block with a non-JSON string="false" value is content');
    assertEq(r.choices[0].message.tool_calls ?? [], [], 'no calls');
    assertEq(r.choices[0].finish_reason, 'stop', 'finish_reason');
    await waitFor([suppressed0 + 4, malformed0 + 1]);
  }],

  ['completions: string and token-id prompts, stream with usage', async ({ mesh }) => {
    const r = await client(mesh).completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 50, temperature: 0 });
    assertEq(r.object, 'text_completion', 'object');
    assertEq(r.choices[0].text, 'Once upon a time', 'text (the parrot echoes the prompt after BOS)');
    assertEq(r.choices[0].finish_reason, 'stop', 'finish');
    const ids = (await (await fetch(`${mesh.base}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: 'Hello world' }) })).json()).tokens;
    const r2 = await client(mesh).completions.create({ model: MODEL, prompt: ids, max_tokens: 50, temperature: 0 });
    assertEq(r2.choices[0].text, 'Hello world', 'token-id prompt');
    assertEq(r2.usage.prompt_tokens, ids.length, 'prompt tokens');
    const chunks = await collect(await client(mesh).completions.create({ model: MODEL, prompt: 'Streaming completion', stream: true, temperature: 0, stream_options: { include_usage: true } }));
    assertEq(chunks.map((c) => c.choices[0]?.text ?? '').join(''), 'Streaming completion', 'streamed text');
    assertEq(chunks[chunks.length - 1].choices, [], 'usage chunk');
    assert(chunks[chunks.length - 1].usage.completion_tokens > 0, 'usage');
  }],

  ['logprobs and top_logprobs', async ({ mesh }) => {
    const r = await client(mesh).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'red green blue' }], logprobs: true, top_logprobs: 2, chat_template_kwargs: { thinking: false } });
    const lp = r.choices[0].logprobs.content;
    assert(lp.length >= 3, 'one entry per token');
    for (const e of lp) {
      assert(typeof e.token === 'string' && typeof e.logprob === 'number' && Array.isArray(e.bytes), 'entry shape');
      assertEq(e.top_logprobs.length, 2, 'top_logprobs count');
    }
    const c = await client(mesh).completions.create({ model: MODEL, prompt: 'red green blue', logprobs: 1 });
    assert(c.choices[0].logprobs.tokens.length >= 3, 'completions logprobs tokens');
  }],

  ['X-Request-Id is honored, echoed and used as the response id', async ({ mesh }) => {
    const { data, response } = await client(mesh).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }] },
      { headers: { 'X-Request-Id': 'test-req-123' } }).withResponse();
    assertEq(response.headers.get('x-request-id'), 'test-req-123', 'echoed');
    assertEq(data.id, 'chatcmpl-test-req-123', 'response id');
    const { response: r2 } = await client(mesh).models.list().withResponse();
    assert(/^[0-9a-f]{32}$/.test(r2.headers.get('x-request-id')), 'generated when absent');
  }],

  ['errors: OpenAI bodies and status codes', async ({ mesh }) => {
    const c = client(mesh);
    const msg = [{ role: 'user', content: 'hi' }];
    await expectError(c.chat.completions.create({ model: 'other-model', messages: msg }), 404, /does not exist/);
    await expectError(c.chat.completions.create({ model: MODEL, messages: msg, n: 129 }), 400, /'n'/);
    await expectError(c.chat.completions.create({ model: MODEL, messages: msg, temperature: 'hot' }), 400, /temperature/);
    await expectError(c.chat.completions.create({ model: MODEL, messages: msg, temperature: 5 }), 400, /temperature/);
    await expectError(c.chat.completions.create({ model: MODEL, messages: msg, top_logprobs: 3 }), 400, /logprobs/);
    await expectError(c.chat.completions.create({ model: MODEL }), 400, /messages/);
    await expectError(c.chat.completions.create({ model: MODEL, messages: [{ role: 'wizard', content: 'x' }] }), 400);
    await expectError(c.chat.completions.create({ model: MODEL, messages: msg, response_format: { type: 'yaml' } }), 400, /response_format/);
    await expectError(c.chat.completions.create({ model: MODEL, messages: msg, stream: false, stream_options: { include_usage: true } }), 400);
    const e = await expectError(c.chat.completions.create({ model: MODEL, messages: msg, max_tokens: 10000 }), 400, /maximum context length is 4096 tokens.*you requested \d+ tokens \(\d+ in the messages, 10000 in the completion\)/);
    assertEq(e.code, 'context_length_exceeded', 'code');
    await expectError(c.completions.create({ model: MODEL, prompt: 'x '.repeat(5000) }), 400, /maximum context length is 4096/);
    await expectError(c.completions.create({ model: MODEL, prompt: [1, 2, 99999999] }), 400, /token ids/);
    // Raw HTTP: malformed JSON, wrong method, unknown path, empty body.
    const post = (p, body, h = {}) => fetch(`${mesh.base}${p}`, { method: 'POST', headers: { 'content-type': 'application/json', ...h }, body });
    let r = await post('/v1/chat/completions', '{"model": "dsmesh-test", "messages": [');
    assertEq(r.status, 400, 'truncated JSON');
    assert((await r.json()).error.message.includes('malformed JSON'), 'malformed JSON message');
    r = await fetch(`${mesh.base}/v1/nope`);
    assertEq(r.status, 404, 'unknown path');
    assertEq((await r.json()).error.type, 'not_found_error', 'not found type');
    r = await fetch(`${mesh.base}/v1/chat/completions`);
    assertEq(r.status, 405, 'GET on a POST endpoint');
    r = await post('/v1/completions', '');
    assertEq(r.status, 400, 'empty body');
    r = await post('/v1/completions', JSON.stringify({ prompt: 'x', pad: 'y'.repeat(1200000) }));
    assertEq(r.status, 413, 'oversized body');
    assert((await r.json()).error.message.includes('exceeds the limit'), '413 message');
  }],

  // Image parts through the served path: every image is decoded (common/image) and a bad one gets its
  // own 400 naming the content part; a good one is refused because the model has no vision tower.
  ['images: decoded, then refused by a text-only model; bad images 400 naming the part', async ({ mesh }) => {
    const c = client(mesh);
    const file = (n) => fs.readFileSync(`common/image/testdata/${n}`);
    const dataUrl = (mime, bytes) => `data:${mime};base64,${Buffer.from(bytes).toString('base64')}`;
    const ask = (url, extra = {}) => c.chat.completions.create({ model: MODEL, ...extra, messages: [
      { role: 'user', content: 'hi' },
      { role: 'user', content: [{ type: 'text', text: 'what is this?' }, { type: 'image_url', image_url: { url } }] }] });
    const part = 'messages[1].content[1].image_url';
    const check = async (promise, re, code) => {
      const e = await expectError(promise, 400, re);
      assertEq(e.param, part, `param of ${e.message}`);
      if (code) assertEq(e.code, code, `code of ${e.message}`);
      assertEq(e.type, 'invalid_request_error', 'type');
    };
    for (const [name, mime] of [['rgb.png', 'image/png'], ['rgb.jpg', 'image/jpeg'], ['lossy.webp', 'image/webp']]) {
      await check(ask(dataUrl(mime, file(name))), /model `dsmesh-test` does not accept images: it has no vision tower/, 'images_not_supported');
      await check(ask(dataUrl(mime, file(name)), { stream: true }), /does not accept images/, 'images_not_supported');
    }
    const png = file('rgb.png');
    await check(ask(dataUrl('image/png', png.subarray(0, png.length - 20))), /invalid PNG data/, 'invalid_image');
    const badCrc = Buffer.from(png); badCrc[29] ^= 1;
    await check(ask(dataUrl('image/png', badCrc)), /IHDR: CRC error/, 'invalid_image');
    const huge = Buffer.from(png); huge.writeUInt32BE(100000, 16); huge.writeUInt32BE(100000, 20);
    huge.writeUInt32BE(pngCrc32(huge.subarray(12, 29)), 29);
    await check(ask(dataUrl('image/png', huge)), /100000 x 100000 pixels; each side may be at most 16384/, 'invalid_image');
    await check(ask(dataUrl('image/png', file('rgb.jpg'))), /declares image\/png but the data is JPEG/, 'invalid_image');
    await check(ask(dataUrl('image/png', Buffer.alloc(0))), /the image data is empty/, 'invalid_image');
    await check(ask('data:image/png;base64,not base64!'), /invalid base64/, 'invalid_image');
    await check(ask('https://example.com/cat.png'), /not fetched/, 'invalid_image');
    await check(ask('file:///etc/passwd'), /--allowed-local-media-path/, 'invalid_image');
    await check(ask(dataUrl('image/gif', Buffer.from('GIF89a'))), /media type 'image\/gif' is not supported/, 'invalid_image');
    // The parser's own checks of the part, mapped to the part as param.
    await check(c.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' },
      { role: 'user', content: [{ type: 'text', text: 'x' }, { type: 'image_url', image_url: { url: 7 } }] }] }), /image_url.url must be a string/);
    // /tokenize takes the same path.
    const r = await fetch(`${mesh.base}/tokenize`, { method: 'POST', body: JSON.stringify({ model: MODEL,
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: dataUrl('image/png', png) } }] }] }) });
    assertEq(r.status, 400, '/tokenize with an image');
    const body = await r.json();
    assertEq(body.error.param, 'messages[0].content[0].image_url', '/tokenize param');
    assert(/does not accept images/.test(body.error.message), body.error.message);
  }],

  ['tokenize / detokenize (vLLM shape)', async ({ mesh }) => {
    const t = await (await fetch(`${mesh.base}/tokenize`, { method: 'POST', body: JSON.stringify({ model: MODEL, prompt: 'Hello, 世界!' }) })).json();
    assertEq(t.count, t.tokens.length, 'count');
    assertEq(t.max_model_len, 4096, 'max_model_len');
    const d = await (await fetch(`${mesh.base}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: t.tokens }) })).json();
    assert(d.prompt.endsWith('Hello, 世界!'), `round trip: ${d.prompt}`);
    const bad = await fetch(`${mesh.base}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: [-1] }) });
    assertEq(bad.status, 400, 'bad id');
  }],

  ['silent streams get ": ping" comments that the client ignores', async ({ sleepy }) => {
    const body = { model: MODEL, messages: [{ role: 'user', content: 'one two three' }], max_tokens: 2, temperature: 0, stream: true,
      chat_template_kwargs: { thinking: false } };
    const raw = await rawStream(`${sleepy.url}/chat/completions`, body);
    assert(raw.text.includes('\n\n: ping\n\n'), `ping comment in ${JSON.stringify(raw.text.slice(0, 400))}`);
    const chunks = await collect(await client(sleepy).chat.completions.create(body));
    assertEq(chunks[chunks.length - 1].choices[0].finish_reason, 'length', 'client parsed the stream');
  }],

  ['client disconnect with n: 3 aborts every choice in the mesh', async ({ slow }) => {
    const controller = new AbortController();
    const text = Array.from({ length: 200 }, (_, i) => `w${i}`).join(' ');
    const before = metricValue(await metricsText(slow.base), 'vllm:request_success_total{model_name="dsmesh-test",engine="0",finished_reason="abort"}') ?? 0;
    const stream = await client(slow).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: text }], stream: true, n: 3,
      chat_template_kwargs: { thinking: false } }, { signal: controller.signal });
    let seen = 0;
    try {
      for await (const c of stream) { if (++seen === 9) controller.abort(); }
    } catch (e) { /* aborted */ }
    const deadline = Date.now() + 3000;
    let running, aborts;
    while (Date.now() < deadline) {
      const m = await metricsText(slow.base);
      running = metricValue(m, 'vllm:num_requests_running{model_name="dsmesh-test",engine="0"}');
      aborts = metricValue(m, 'vllm:request_success_total{model_name="dsmesh-test",engine="0",finished_reason="abort"}');
      if (running === 0 && aborts > before) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assertEq(running, 0, 'all three sequences are gone (num_requests_running)');
    assertEq(aborts, before + 1, 'one request counted as abort');
  }],

  ['client disconnect aborts the request in the mesh and frees its slot', async ({ slow }) => {
    const controller = new AbortController();
    const text = Array.from({ length: 200 }, (_, i) => `w${i}`).join(' ');
    const stream = await client(slow).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: text }], stream: true,
      chat_template_kwargs: { thinking: false } }, { signal: controller.signal });
    let seen = 0;
    try {
      for await (const c of stream) { if (++seen === 3) controller.abort(); }
    } catch (e) { /* aborted */ }
    assert(seen >= 3, 'received some chunks');
    const deadline = Date.now() + 3000;
    let running, aborts;
    while (Date.now() < deadline) {
      const m = await metricsText(slow.base);
      running = metricValue(m, 'vllm:num_requests_running{model_name="dsmesh-test",engine="0"}');
      aborts = metricValue(m, 'vllm:request_success_total{model_name="dsmesh-test",engine="0",finished_reason="abort"}');
      if (running === 0 && aborts >= 1) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assertEq(running, 0, 'the slot is free (num_requests_running)');
    assert(aborts >= 1, 'counted as abort');
  }],
];

await runCases(cases, {
  setup: async () => ({
    mesh: await startMesh({ extraGatewayArgs: ['--max-body-bytes', '1000000'] }),
    spec: await startMesh({ tokensPerStep: 3 }),
    slow: await startMesh({ stepMs: 50 }),
    sleepy: await startMesh({ stepMs: 1300, extraGatewayArgs: ['--sse-ping-s', '1'] }),
  }),
  teardown: async (ctx) => { for (const m of Object.values(ctx)) await m.stop(); },
});

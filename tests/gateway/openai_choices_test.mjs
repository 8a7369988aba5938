// n > 1, best_of and the Responses API on the real mesh (`dsmesh up --no-gateway`: coordinator + 2 CPU
// workers, tiny model; dsmesh-gateway started by the harness), driven by the official openai client:
// n: 3 streaming and not (indices 0..2, usage summing every choice's tokens, seeded choices reproducible
// one by one), best_of, the 400s, client.responses.create (streaming and not, instructions, function
// tools, text.format json_schema, reasoning items) and a zod-derived response_format.
import { assert, assertEq, loadOpenAI, metricsText, metricValue, NODE_MODULES, runCases, startRealMesh } from './harness.mjs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const OpenAI = await loadOpenAI();
const imp = (p) => import(pathToFileURL(path.join(NODE_MODULES, p)).href);
const { z } = await imp('zod/index.js');
const { zodResponseFormat, zodTextFormat } = await imp('openai/helpers/zod.mjs');

const MODEL = 'dsmesh-test';
const client = (m) => new OpenAI({ baseURL: m.url, apiKey: 'none', maxRetries: 0, timeout: 300000 });
const messages = [{ role: 'user', content: 'Name three colors.' }];
const noThink = { chat_template_kwargs: { thinking: false } };

async function expectError(promise, status, param, re) {
  try {
    await promise;
  } catch (e) {
    assertEq(e.status, status, `status (${e.message})`);
    assertEq(e.error?.param ?? e.param, param, `param (${e.message})`);
    if (re) assert(re.test(e.message), `message ${e.message} matches ${re}`);
    return;
  }
  throw new Error(`expected ${status}`);
}

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

const weather = {
  type: 'function', name: 'get_weather', description: 'Weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'], additionalProperties: false },
  strict: true,
};

const cases = [
  ['chat n: 3 (not streaming): choices 0..2, usage counts every choice, seeded choices are reproducible', async ({ m }) => {
    const req = { model: MODEL, messages, n: 3, max_tokens: 12, temperature: 1, seed: 7, ignore_eos: true, ...noThink };
    const r = await client(m).chat.completions.create(req);
    assertEq(r.choices.map((c) => c.index), [0, 1, 2], 'indices');
    for (const c of r.choices) assertEq(c.finish_reason, 'length', `finish_reason ${c.index}`);
    assertEq(r.usage.completion_tokens, 36, 'completion tokens: 3 choices x 12');
    assertEq(r.usage.total_tokens, r.usage.prompt_tokens + 36, 'total');
    const texts = r.choices.map((c) => c.message.content);
    assert(new Set(texts).size > 1, `distinct seeds give distinct choices: ${JSON.stringify(texts)}`);
    const again = await client(m).chat.completions.create(req);
    assertEq(again.choices.map((c) => c.message.content), texts, 'same seed, same choices');
    // Choice 0 keeps the request's seed: it is what n = 1 answers.
    const one = await client(m).chat.completions.create({ ...req, n: 1 });
    assertEq(one.choices[0].message.content, texts[0], 'choice 0 = the n = 1 answer');
  }],

  ['chat n: 3 streaming: every chunk carries its index, each choice finishes once, usage sums', async ({ m }) => {
    const stream = await client(m).chat.completions.create({ model: MODEL, messages, n: 3, max_tokens: 10, temperature: 1,
      seed: 11, ignore_eos: true, stream: true, stream_options: { include_usage: true }, ...noThink });
    const chunks = await collect(stream);
    const text = ['', '', ''], finishes = [0, 0, 0], roles = [0, 0, 0];
    for (const c of chunks) {
      if (c.choices.length === 0) continue;
      assertEq(c.choices.length, 1, 'one choice per chunk');
      const ch = c.choices[0];
      assert(ch.index >= 0 && ch.index < 3, `index ${ch.index}`);
      if (ch.delta.role) roles[ch.index]++;
      text[ch.index] += ch.delta.content ?? '';
      if (ch.finish_reason) { finishes[ch.index]++; assertEq(ch.finish_reason, 'length', 'finish'); }
    }
    assertEq(roles, [1, 1, 1], 'one role chunk per choice');
    assertEq(finishes, [1, 1, 1], 'one finish per choice');
    const usage = chunks[chunks.length - 1].usage;
    assertEq(usage.completion_tokens, 30, 'usage: 3 x 10');
    const whole = await client(m).chat.completions.create({ model: MODEL, messages, n: 3, max_tokens: 10, temperature: 1, seed: 11,
      ignore_eos: true, ...noThink });
    assertEq(text, whole.choices.map((c) => c.message.content), 'streamed choices = non-streamed choices');
  }],

  ['completions n: 3 streaming and not; greedy n > 1 gives identical choices', async ({ m }) => {
    const r = await client(m).completions.create({ model: MODEL, prompt: 'Once upon a time', n: 3, max_tokens: 8, temperature: 0, ignore_eos: true });
    assertEq(r.choices.map((c) => c.index), [0, 1, 2], 'indices');
    assertEq(new Set(r.choices.map((c) => c.text)).size, 1, 'greedy choices are identical');
    assertEq(r.usage.completion_tokens, 24, 'usage');
    const chunks = await collect(await client(m).completions.create({ model: MODEL, prompt: 'Once upon a time', n: 3, max_tokens: 8,
      temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } }));
    const text = ['', '', ''];
    for (const c of chunks) for (const ch of c.choices) text[ch.index] += ch.text;
    assertEq(text, r.choices.map((c) => c.text), 'streamed = non-streamed');
    assertEq(chunks[chunks.length - 1].usage.completion_tokens, 24, 'streamed usage');
  }],

  ['n > 1 shares the prompt through the prefix cache (choices 1.. start from choice 0\'s snapshot)', async ({ m }) => {
    // Longer than one state-pool block (256 tokens): snapshots are taken at block boundaries.
    const long = 'The quick brown fox jumps over the lazy dog. '.repeat(40);
    const before = metricValue(await metricsText(m.base), 'vllm:prefix_cache_hits_total') ?? 0;
    const r = await client(m).completions.create({ model: MODEL, prompt: long + ' #' + Date.now(), n: 3, max_tokens: 4, temperature: 1 });
    const after = metricValue(await metricsText(m.base), 'vllm:prefix_cache_hits_total') ?? 0;
    assert(after - before >= 2 * 256, `prefix-cache hits grew by ${after - before} tokens (prompt ${r.usage.prompt_tokens})`);
    assert((r.usage.prompt_tokens_details?.cached_tokens ?? 0) >= 256, `cached_tokens ${JSON.stringify(r.usage)}`);
  }],

  ['best_of: 3 with n: 1 returns the sequence with the highest cumulative logprob; usage counts all 3', async ({ m }) => {
    const req = { model: MODEL, prompt: 'Hello', max_tokens: 6, temperature: 1, seed: 3, ignore_eos: true, logprobs: 0 };
    const best = await client(m).completions.create({ ...req, best_of: 3 });
    assertEq(best.choices.length, 1, 'n choices');
    assertEq(best.usage.completion_tokens, 18, 'usage counts every sequence');
    const all = await client(m).completions.create({ ...req, n: 3 });
    const sum = (c) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0);
    const top = all.choices.reduce((a, b) => (sum(b) > sum(a) ? b : a));
    assertEq(best.choices[0].text, top.text, 'the best of the same 3 seeded sequences');
  }],

  ['validation: n and best_of bounds are 400s naming the field', async ({ m }) => {
    const c = client(m);
    await expectError(c.chat.completions.create({ model: MODEL, messages, n: 0 }), 400, 'n');
    await expectError(c.chat.completions.create({ model: MODEL, messages, n: 129 }), 400, 'n');
    await expectError(c.completions.create({ model: MODEL, prompt: 'x', n: 3, best_of: 2 }), 400, 'best_of');
    await expectError(c.completions.create({ model: MODEL, prompt: 'x', best_of: 2, stream: true }), 400, 'best_of');
  }],

  ['responses.create (not streaming): instructions + input, output message, usage', async ({ m }) => {
    const r = await client(m).responses.create({ model: MODEL, instructions: 'You are terse.', input: 'Name a color.',
      max_output_tokens: 16, temperature: 1, reasoning: { effort: 'none' } });
    assertEq(r.object, 'response', 'object');
    assert(r.id.startsWith('resp_'), `id ${r.id}`);
    assertEq(r.store, false, 'stateless');
    assertEq(r.instructions, 'You are terse.', 'instructions echoed');
    assert(['completed', 'incomplete'].includes(r.status), `status ${r.status}`);
    const msg = r.output.find((o) => o.type === 'message');
    assert(msg && msg.content[0].type === 'output_text', `message item: ${JSON.stringify(r.output)}`);
    assertEq(r.output_text, msg.content[0].text, 'the client\'s output_text');
    assert(r.usage.output_tokens > 0 && r.usage.output_tokens <= 16, `usage ${JSON.stringify(r.usage)}`);
    assertEq(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens, 'total');
    if (r.status === 'incomplete') assertEq(r.incomplete_details.reason, 'max_output_tokens', 'incomplete reason');
  }],

  ['responses.create (streaming): the event sequence, and responses.stream() accumulates the same response', async ({ m }) => {
    const req = { model: MODEL, input: [{ role: 'user', content: 'Say hi.' }], max_output_tokens: 12, temperature: 1,
      reasoning: { effort: 'none' } };
    const events = await collect(await client(m).responses.create({ ...req, stream: true }));
    const types = events.map((e) => e.type);
    const expect = ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added'];
    assertEq(types.slice(0, 4), expect, 'opening events');
    const tail = types.slice(-4);
    assertEq(tail.slice(0, 3), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done'], 'closing events');
    assert(['response.completed', 'response.incomplete'].includes(tail[3]), `terminal ${tail[3]}`);
    assert(types.includes('response.output_text.delta'), 'deltas');
    events.forEach((e, i) => assertEq(e.sequence_number, i, 'sequence numbers'));
    const deltas = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
    const done = events.find((e) => e.type === 'response.output_text.done');
    assertEq(deltas, done.text, 'deltas add up to the done text');
    const final = events[events.length - 1].response;
    assert(final.usage.output_tokens > 0, 'usage on the terminal event');
    const stream = client(m).responses.stream(req);
    const acc = await stream.finalResponse();
    assertEq(acc.output.length, 1, 'accumulated one item');
    assertEq(acc.output_text, acc.output[0].content[0].text, 'accumulated output_text');
  }],

  ['responses: thinking on gives a reasoning item before the message', async ({ m }) => {
    const r = await client(m).responses.create({ model: MODEL, input: 'Think, then answer.', max_output_tokens: 24, temperature: 1, seed: 5 });
    // The random model rarely closes </think>: then the whole output is reasoning (status incomplete).
    assertEq(r.output[0].type, 'reasoning', `first item ${JSON.stringify(r.output[0])}`);
    assertEq(r.output[0].content[0].type, 'reasoning_text', 'reasoning content');
    assert(r.output[0].content[0].text.length > 0, 'reasoning text');
    const events = await collect(await client(m).responses.create({ model: MODEL, input: 'Think, then answer.', max_output_tokens: 24,
      temperature: 1, seed: 5, stream: true }));
    const text = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
    assertEq(text, r.output[0].content[0].text, 'streamed reasoning = non-streamed');
  }],

  ['responses: function tools with tool_choice required give function_call items (streaming and not)', async ({ m }) => {
    const req = { model: MODEL, input: 'Weather in Oslo?', tools: [weather], tool_choice: 'required', parallel_tool_calls: false,
      max_output_tokens: 96, temperature: 1, seed: 2 };
    const r = await client(m).responses.create(req);
    const calls = r.output.filter((o) => o.type === 'function_call');
    assertEq(calls.length, 1, `one call: ${JSON.stringify(r.output)}`);
    assertEq(calls[0].name, 'get_weather', 'name');
    const args = JSON.parse(calls[0].arguments);
    assert(typeof args.city === 'string' && Number.isInteger(args.days) && args.days >= 1 && args.days <= 7, `arguments ${calls[0].arguments}`);
    assert(calls[0].call_id, 'call_id');
    const events = await collect(await client(m).responses.create({ ...req, stream: true }));
    const done = events.find((e) => e.type === 'response.function_call_arguments.done');
    assertEq(done.arguments, calls[0].arguments, 'streamed arguments = non-streamed');
    const deltas = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
    assertEq(deltas, done.arguments, 'argument deltas add up');
    // The call's result goes back as input items (stateless: the whole conversation each time).
    const next = await client(m).responses.create({ model: MODEL, tools: [weather], max_output_tokens: 8, reasoning: { effort: 'none' },
      input: [{ role: 'user', content: 'Weather in Oslo?' }, { type: 'function_call', call_id: calls[0].call_id, name: 'get_weather', arguments: calls[0].arguments },
        { type: 'function_call_output', call_id: calls[0].call_id, output: '{"temp": 3}' }] });
    assert(next.output.length > 0, 'answered after the tool output');
  }],

  ['responses: text.format json_schema (zodTextFormat) constrains the output', async ({ m }) => {
    const Color = z.object({ name: z.string().max(10), rgb: z.array(z.number().int().min(0).max(255)).length(3) });
    const r = await client(m).responses.parse({ model: MODEL, input: 'A color as JSON.', max_output_tokens: 64, temperature: 1, seed: 9,
      text: { format: zodTextFormat(Color, 'color') } });
    const parsed = Color.parse(JSON.parse(r.output_text));
    assertEq(r.output_parsed, parsed, 'the client parsed it too');
  }],

  ['responses: stateless and unsupported fields are 400s naming the field', async ({ m }) => {
    const c = client(m);
    await expectError(c.responses.create({ model: MODEL, input: 'x', previous_response_id: 'resp_123' }), 400, 'previous_response_id', /stateless/);
    await expectError(c.responses.create({ model: MODEL }), 400, 'input');
    await expectError(c.responses.create({ model: MODEL, input: 'x', tools: [{ type: 'web_search' }] }), 400, 'tools[0].type');
    await expectError(c.responses.create({ model: MODEL, input: 'x', max_output_tokens: 0 }), 400, 'max_output_tokens');
    await expectError(c.responses.create({ model: MODEL, input: 'x', text: { format: { type: 'json_schema', name: 'a', schema: { not: {} } } } }),
      400, 'text.format.schema', /'not' is not supported \(at text\.format\.schema\/not\)/);
  }],

  ['chat response_format from zod (zodResponseFormat): the output parses with the zod schema', async ({ m }) => {
    const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120), tags: z.array(z.enum(['a', 'b'])).max(3) });
    for (const seed of [1, 2, 3]) {
      const r = await client(m).chat.completions.parse({ model: MODEL, messages: [{ role: 'user', content: 'A person.' }], max_tokens: 80,
        temperature: 1, seed, response_format: zodResponseFormat(Person, 'person') });
      const msg = r.choices[0].message;
      assertEq(msg.parsed, Person.parse(JSON.parse(msg.content)), `seed ${seed}: parsed and valid`);
    }
  }],
];

await runCases(cases, {
  setup: async () => ({ m: await startRealMesh({ world: 2, maxNumSeqs: 8 }) }),
  teardown: async ({ m }) => m && m.stop(),
});

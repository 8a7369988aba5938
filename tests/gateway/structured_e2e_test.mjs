// Constrained decoding end to end: `dsmesh up` on the tiny *random* model, driven by the official openai
// client. Every schema of common/structured/testdata/schemas.json (35) through response_format json_schema,
// json_object, and tool_choice "required" / named: each output parses and validates against its schema with
// python3-jsonschema (common/structured/testdata/validate.py), though the model itself produces noise.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ROOT, assert, assertEq, freePort, loadOpenAI, runCases, track, waitHealthy } from './harness.mjs';

const OpenAI = await loadOpenAI();
const args = process.argv.slice(2);
const DSMESH = path.resolve(args[args.indexOf('--dsmesh') + 1]);
const SCHEMAS = JSON.parse(fs.readFileSync(path.join(ROOT, 'common/structured/testdata/schemas.json'), 'utf8'));
const VALIDATE = path.join(ROOT, 'common/structured/testdata/validate.py');
// --speculative: the mesh runs MTP speculation (3 drafts): drafts that leave the grammar must be rejected.
const SPECULATIVE = args.includes('--speculative');
// --trained: the trained small model `./dsmesh up` serves (models/dsv4-small) instead of the random one.
const TRAINED = args.includes('--trained');
const MODEL_KIND = TRAINED ? 'trained model' : 'random model';
const PYTHON = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

async function startUp() {
  const dir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'structured-'));
  let model = path.join(ROOT, 'models/dsv4-small');
  if (!TRAINED) {
    model = path.join(dir, 'tiny');
    const mk = spawnSync(DSMESH, ['make-tiny', '--out', model], { encoding: 'utf8' });
    assertEq(mk.status, 0, `make-tiny: ${mk.stderr}`);
  }
  assert(fs.existsSync(path.join(model, 'config.json')), `${model}: no config.json`);
  const port = await freePort();
  const up = track(spawn(DSMESH, ['up', '--model', model, '--world', TRAINED ? '1' : '2', '--port', String(port), '--kv-memory', '64M',
    '--max-num-seqs', '4', '--served-model-name', 'tiny-model',
    ...(SPECULATIVE ? ['--speculative-config', '{"method":"mtp","num_speculative_tokens":3}', '--draft-policy', 'fixed'] : [])], { stdio: ['ignore', 'ignore', 'pipe'] }), 'SIGINT');
  let log = '';
  up.stderr.on('data', (d) => { log += d; if (process.env.GATEWAY_TEST_VERBOSE) process.stderr.write(d); });
  const base = `http://127.0.0.1:${port}`;
  await waitHealthy(base, 120000).catch((e) => { throw new Error(`${e.message}\n${log}`); });
  return {
    base, url: `${base}/v1`, log: () => log,
    async stop() { up.kill('SIGINT'); await new Promise((r) => { up.once('exit', r); setTimeout(r, 20000); }); },
  };
}

const client = (m) => new OpenAI({ baseURL: m.url, apiKey: 'none', maxRetries: 0, timeout: 300000 });
const messages = [{ role: 'user', content: 'Answer in JSON.' }];

function validate(cases) {
  const file = path.join(process.env.TEST_TMPDIR || os.tmpdir(), `validate-${process.pid}-${Date.now()}.json`);
  fs.writeFileSync(file, JSON.stringify(cases));
  const r = spawnSync(PYTHON, [VALIDATE, file], { encoding: 'utf8' });
  assertEq(r.status, 0, `python3-jsonschema:\n${r.stdout}${r.stderr}`);
  console.log(`     ${r.stdout.trim()}`);
}

async function pool(items, width, fn) {
  const out = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < items.length) { const i = next++; out[i] = await fn(items[i], i); }
  }));
  return out;
}

const weather = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 },
      units: { type: 'string', enum: ['c', 'f'] } }, required: ['city', 'days'] },
  },
};
const lookup = {
  type: 'function',
  function: { name: 'lookup', parameters: { type: 'object', properties: { ids: { type: 'array', items: { type: 'integer', minimum: 0, maximum: 99 }, maxItems: 3 } }, required: ['ids'] } },
};

const cases = [
  [`response_format json_schema: ${SCHEMAS.length} schemas, every output validates (${MODEL_KIND}, sampled)`, async ({ m }) => {
    const outs = await pool(SCHEMAS, 4, async (s, i) => {
      const r = await client(m).chat.completions.create({
        model: 'tiny-model', messages, max_tokens: 96, temperature: 1, seed: 100 + i,
        response_format: { type: 'json_schema', json_schema: { name: s.name, schema: s.schema, strict: true } },
      });
      return { name: s.name, schema: s.schema, output: r.choices[0].message.content ?? '' };
    });
    validate(outs);
  }],
  ['response_format json_object and greedy json_schema, streaming', async ({ m }) => {
    const r = await client(m).chat.completions.create({ model: 'tiny-model', messages, max_tokens: 64, response_format: { type: 'json_object' } });
    const outs = [{ name: 'json_object', schema: { type: 'object' }, output: r.choices[0].message.content }];
    const s = SCHEMAS.find((x) => x.name === 'zod_like');
    const stream = await client(m).chat.completions.create({ model: 'tiny-model', messages, max_tokens: 96, temperature: 0, stream: true,
      response_format: { type: 'json_schema', json_schema: { name: 'zod_like', schema: s.schema, strict: true } } });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    outs.push({ name: 'zod_like streamed', schema: s.schema, output: text });
    validate(outs);
  }],
  ['tool_choice "required" and a named function force valid calls', async ({ m }) => {
    const outs = [];
    for (const [i, tool_choice] of ['required', { type: 'function', function: { name: 'lookup' } }].entries()) {
      const r = await client(m).chat.completions.create({ model: 'tiny-model', messages: [{ role: 'user', content: 'weather?' }],
        tools: [weather, lookup], tool_choice, max_tokens: 160, temperature: 1, seed: 7 + i });
      const msg = r.choices[0].message;
      assert(msg.tool_calls && msg.tool_calls.length >= 1, `tool calls: ${JSON.stringify(r.choices[0])}`);
      assertEq(r.choices[0].finish_reason, 'tool_calls', 'finish_reason');
      if (i === 1) assertEq(msg.tool_calls.map((c) => c.function.name), ['lookup'], 'named function');
      for (const c of msg.tool_calls) {
        const tool = [weather, lookup].find((t) => t.function.name === c.function.name);
        assert(tool, `unknown tool ${c.function.name}`);
        outs.push({ name: `tool ${c.function.name}`, schema: tool.function.parameters, output: c.function.arguments });
      }
    }
    validate(outs);
  }],
  ['unsupported schema keywords and bad tool_choice are 400s naming the field', async ({ m }) => {
    const bad = async (body, param, word) => {
      const r = await fetch(`${m.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny-model', messages, max_tokens: 4, ...body }) });
      assertEq(r.status, 400, JSON.stringify(body));
      const e = (await r.json()).error;
      assertEq(e.param, param, `param of ${JSON.stringify(body)}`);
      assert(e.message.includes(word), `message '${e.message}' names ${word}`);
    };
    await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'integer', multipleOf: 3 } } } },
      'response_format.json_schema.schema', 'multipleOf');
    await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { not: {} } } } } } },
      'response_format.json_schema.schema', "'not'");
    await bad({ response_format: { type: 'yaml' } }, 'response_format.type', 'yaml');
    await bad({ tools: [weather], tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice', 'nope');
    await bad({ tool_choice: 'required' }, 'tool_choice', 'tools');
    await bad({ guided_regex: '(?=x)' }, 'guided_regex', 'lookaround');
  }],
  ['vLLM guided_regex and guided_choice', async ({ m }) => {
    const body = (extra) => ({ method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny-model', messages, max_tokens: 24, temperature: 1, seed: 3, ...extra }) });
    let r = await (await fetch(`${m.url}/chat/completions`, body({ guided_regex: '[0-9]{3}-[a-z]{2}' }))).json();
    assert(/^[0-9]{3}-[a-z]{2}$/.test(r.choices[0].message.content), `regex output ${r.choices[0].message.content}`);
    r = await (await fetch(`${m.url}/chat/completions`, body({ guided_choice: ['yes', 'no'] }))).json();
    assert(['yes', 'no'].includes(r.choices[0].message.content), `choice output ${r.choices[0].message.content}`);
  }],
];
if (SPECULATIVE) {
  cases.push(['speculation ran on the constrained requests (drafts proposed and verified)', async ({ m }) => {
    const text = await (await fetch(`${m.base}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith('vllm:spec_decode_num_draft_tokens_total'));
    assert(line && Number(line.trim().split(/\s+/).pop()) > 0, `draft tokens: ${line}`);
    console.log(`     ${line}; ${text.split('\n').find((l) => l.startsWith('vllm:spec_decode_num_accepted_tokens_total'))}`);
  }]);
}

await runCases(cases, { setup: async () => ({ m: await startUp() }), teardown: async ({ m }) => m.stop() });

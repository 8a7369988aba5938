// Lifecycle and failure behaviour: API keys (only /v1/* protected), 503 while the mesh is not ready,
// a coordinator that dies mid-stream (the stream must end with an error event and [DONE], never go
// silent; non-streaming requests get 503), and SIGTERM draining (/health 503, in-flight requests
// finish, the process exits 0).
import fs from 'node:fs';
import net from 'node:net';
import { assert, assertEq, loadOpenAI, metricsText, metricValue, rawStream, runCases, startMesh } from './harness.mjs';

const OpenAI = await loadOpenAI();
const MODEL = 'dsmesh-test';
const msg = (content) => [{ role: 'user', content }];

// The threads of process `pid` that would take SIGTERM or SIGINT with its default action (the process dies at
// once, no drain): every thread must block both, so that only the gateway's sigwait takes them. The main thread
// is left out: while it waits in sigwait the kernel shows those two unblocked (sigwait's own doing).
function threadsTakingShutdownSignals(pid) {
  const bits = (1n << BigInt(15 - 1)) | (1n << BigInt(2 - 1));  // SIGTERM, SIGINT
  const open = [];
  for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
    if (tid === String(pid)) continue;
    let status;
    try { status = fs.readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8'); } catch (e) { continue; }  // exited
    const blocked = BigInt(`0x${status.match(/^SigBlk:\s*([0-9a-f]+)/m)[1]}`);
    if ((blocked & bits) !== bits) open.push(`${status.match(/^Name:\s*(.*)/m)[1]} (tid ${tid}, SigBlk ${blocked.toString(16)})`);
  }
  return open;
}

const cases = [
  ['API key: /v1/* needs it, /health and /metrics stay open; keys and bodies never reach logs or metrics', async () => {
    const mesh = await startMesh({ apiKey: 'sekret' });
    try {
      const ok = new OpenAI({ baseURL: mesh.url, apiKey: 'sekret', maxRetries: 0 });
      assertEq((await ok.models.list()).data[0].id, MODEL, 'right key');
      for (const key of ['wrong', '']) {
        const bad = new OpenAI({ baseURL: mesh.url, apiKey: key || 'x', maxRetries: 0, defaultHeaders: key ? {} : { Authorization: null } });
        try {
          await bad.chat.completions.create({ model: MODEL, messages: msg('hi') });
          throw new Error('expected 401');
        } catch (e) {
          assertEq(e.status, 401, `status with key '${key}'`);
          assertEq(e.code, 'invalid_api_key', 'code');
        }
      }
      const raw = await fetch(`${mesh.url}/models`);
      assertEq(raw.status, 401, 'no Authorization header');
      assertEq(raw.headers.get('www-authenticate'), 'Bearer', 'WWW-Authenticate');
      assertEq((await fetch(`${mesh.base}/health`)).status, 200, '/health open');
      const metrics = await fetch(`${mesh.base}/metrics`);
      assertEq(metrics.status, 200, '/metrics open');
      // A request whose body carries a marker, with a wrong key that looks like the right one, and one
      // with the right key: neither the keys nor the body show up in the gateway's log or its metrics.
      const marker = 'BODY-MARKER-8c1f0e';
      for (const key of ['sekreu', 'sekret']) {
        const r = await fetch(`${mesh.url}/chat/completions`, { method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
          body: JSON.stringify({ model: MODEL, messages: msg(marker), max_tokens: 2, unknown_field_x: marker }) });
        assertEq(r.status, key === 'sekret' ? 200 : 401, `status with key ${key}`);
        await r.text();
      }
      const exposition = await (await fetch(`${mesh.base}/metrics`)).text();
      const log = mesh.gatewayLog();
      for (const secret of ['sekret', 'sekreu', marker]) {
        assert(!log.includes(secret), `gateway log holds '${secret}':\n${log}`);
        assert(!exposition.includes(secret), `metrics hold '${secret}'`);
      }
    } finally { await mesh.stop(); }
  }],

  ['not ready: /health 503 with the reason, requests 503', async () => {
    const mesh = await startMesh({ notReady: true });
    try {
      // Until the gateway's first poll of the coordinator the reason says "starting"; wait for that poll
      // (a deadline, not a fixed sleep: a loaded machine can delay it).
      let h, body;
      for (const deadline = Date.now() + 30000; ;) {
        h = await fetch(`${mesh.base}/health`);
        body = await h.json();
        if (!/^starting/.test(body.reason) || Date.now() > deadline) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      assertEq(h.status, 503, '/health');
      assert(/not ready/.test(body.reason), `reason: ${body.reason}`);
      const c = new OpenAI({ baseURL: mesh.url, apiKey: 'x', maxRetries: 0 });
      try {
        await c.chat.completions.create({ model: MODEL, messages: msg('hi') });
        throw new Error('expected 503');
      } catch (e) { assertEq(e.status, 503, 'status'); }
    } finally { await mesh.stop(); }
  }],

  ['coordinator dies mid-stream: error event then [DONE]; later requests 503', async () => {
    const mesh = await startMesh({ stepMs: 50 });
    try {
      const words = Array.from({ length: 100 }, (_, i) => `x${i}`).join(' ');
      // The coordinator is killed once the stream has sent its first event (not after a fixed wait: on a loaded
      // machine the stream may not have started by then).
      const r = await fetch(`${mesh.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, stream: true, temperature: 0, messages: msg(words) }) });
      assertEq(r.status, 200, 'stream had started');
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let text = '', killed = false;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += decoder.decode(value, { stream: true });
        if (!killed && text.includes('data: ')) { mesh.fixture.kill('SIGKILL'); killed = true; }
      }
      const raw = { status: r.status, text };
      assert(killed, `the stream sent an event before it ended: ${text.slice(0, 300)}`);
      const events = raw.text.split('\n\n').filter(Boolean);
      assertEq(events[events.length - 1], 'data: [DONE]', 'ends with [DONE]');
      const err = JSON.parse(events[events.length - 2].slice(6));
      assert(err.error && /mesh error/.test(err.error.message), `error event: ${events[events.length - 2]}`);
      const c = new OpenAI({ baseURL: mesh.url, apiKey: 'x', maxRetries: 0 });
      // Once the gateway's own poll has seen the coordinator gone (/health 503; a deadline, not a fixed sleep),
      // requests are refused with 503.
      for (const deadline = Date.now() + 30000; ;) {
        if ((await fetch(`${mesh.base}/health`)).status === 503 || Date.now() > deadline) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      assertEq((await fetch(`${mesh.base}/health`)).status, 503, '/health');
      try {
        await c.chat.completions.create({ model: MODEL, messages: msg('hi') });
        throw new Error('expected 503');
      } catch (e) { assertEq(e.status, 503, 'after the coordinator is gone'); }
    } finally { await mesh.stop(); }
  }],

  ['clients that close right after the last byte (no keep-alive reuse) do not upset the gateway', async () => {
    const mesh = await startMesh({ stepMs: 1 });
    try {
      const port = Number(mesh.base.split(':').pop());
      const body = JSON.stringify({ model: MODEL, stream: true, temperature: 0, messages: msg('short reply') });
      for (let i = 0; i < 300; i++) {  // enough to hit the close-during-write race that once corrupted the heap
        await new Promise((resolve, reject) => {
          const s = net.connect(port, '127.0.0.1');
          let got = '';
          s.on('data', (d) => { got += d; if (got.endsWith('0\r\n\r\n')) { s.destroy(); resolve(); } });
          s.on('error', reject);
          s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
          setTimeout(() => reject(new Error(`no complete answer: ${got.slice(-200)}`)), 30000);  // a deadline for a loaded machine
        });
      }
      await new Promise((r) => setTimeout(r, 200));
      assertEq(mesh.gateway.exitCode, null, 'gateway alive');
      assertEq((await fetch(`${mesh.base}/health`)).status, 200, 'health');
      const m = await (await fetch(`${mesh.base}/metrics`)).text();
      assert(/finished_reason="abort"} 0\.0/.test(m), 'completed requests are not counted as aborts');
    } finally { await mesh.stop(); }
  }],

  ['HTTP/1.0 client: the stream is the raw SSE body, ended by closing the connection', async () => {
    const mesh = await startMesh({ stepMs: 1 });
    try {
      const port = Number(mesh.base.split(':').pop());
      const body = JSON.stringify({ model: MODEL, stream: true, temperature: 0, messages: msg('old client') });
      const answer = await new Promise((resolve, reject) => {
        const s = net.connect(port, '127.0.0.1');
        let got = '';
        s.on('data', (d) => { got += d; });
        s.on('end', () => resolve(got));
        s.on('error', reject);
        s.write(`POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
        setTimeout(() => reject(new Error(`connection not closed: ${got.slice(-200)}`)), 30000);  // a deadline for a loaded machine
      });
      const [head, rest] = answer.split('\r\n\r\n');
      assert(head.startsWith('HTTP/1.0 200'), `status line: ${head}`);
      assert(!/transfer-encoding/i.test(head), 'no chunked encoding for HTTP/1.0');
      assert(rest.startsWith('data: {') && rest.endsWith('data: [DONE]\n\n'), `raw SSE body: ${JSON.stringify(rest.slice(0, 80))}`);
    } finally { await mesh.stop(); }
  }],

  ['an engine token outside the vocabulary ends that request with an error, not the gateway', async () => {
    const mesh = await startMesh({ invalidToken: true });
    try {
      const body = { model: MODEL, temperature: 0, messages: msg('some words here') };
      const raw = await rawStream(`${mesh.url}/chat/completions`, { ...body, stream: true });
      const events = raw.text.split('\n\n').filter(Boolean);
      assertEq(events[events.length - 1], 'data: [DONE]', 'stream ends with [DONE]');
      assert(/cannot process the engine's output/.test(events[events.length - 2]), `error event: ${events[events.length - 2]}`);
      const r = await fetch(`${mesh.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      assertEq(r.status, 500, 'non-streaming status');
      assert((await r.json()).error.type === 'server_error', 'error type');
      assertEq(mesh.gateway.exitCode, null, 'gateway alive');
      assertEq((await fetch(`${mesh.base}/health`)).status, 200, 'still healthy');
    } finally { await mesh.stop(); }
  }],

  ['SIGTERM drains: /health 503, in-flight request completes, exit 0', async () => {
    const mesh = await startMesh({ stepMs: 30 });
    try {
      const c = new OpenAI({ baseURL: mesh.url, apiKey: 'x', maxRetries: 0 });
      const words = Array.from({ length: 20 }, (_, i) => `y${i}`).join(' ');
      // A streamed request, SIGTERM once its first chunk arrived: then it is surely in flight (a fixed wait
      // was not: on a loaded machine the request could still be on its way when the signal came).
      const stream = await c.chat.completions.create({ model: MODEL, temperature: 0, stream: true,
                                                       chat_template_kwargs: { thinking: false }, messages: msg(words) });
      const it = stream[Symbol.asyncIterator]();
      const first = await it.next();
      assert(!first.done, 'the stream sent a first chunk');
      const inflight = (async () => {
        let content = first.value.choices[0]?.delta?.content ?? '';
        for (let n = await it.next(); !n.done; n = await it.next()) content += n.value.choices[0]?.delta?.content ?? '';
        return { choices: [{ message: { content } }] };
      })();
      const exited = new Promise((r) => mesh.gateway.once('exit', (code) => r(code)));
      mesh.gateway.kill('SIGTERM');
      // The listener is closed while draining, so /health is refused (or answers 503 if it raced in); until the
      // gateway has handled the signal it still answers 200, so poll (a deadline, not a measurement).
      let health = 200;
      for (const deadline = Date.now() + 30000; health === 200 && Date.now() < deadline;) {
        try { health = (await fetch(`${mesh.base}/health`)).status; } catch (e) { health = 'refused'; }
        if (health === 200) await new Promise((r) => setTimeout(r, 20));
      }
      assert(health === 503 || health === 'refused', `/health while draining: ${health}`);
      const r = await inflight;
      assertEq(r.choices[0].message.content, words, 'in-flight request finished');
      assertEq(await exited, 0, 'exit code');
    } finally { await mesh.stop(); }
  }],

  ['SIGTERM drains a non-streamed request: taken (in-flight gauge 1), then signalled, it still gets its whole answer', async () => {
    const mesh = await startMesh({ stepMs: 30 });
    try {
      const c = new OpenAI({ baseURL: mesh.url, apiKey: 'x', maxRetries: 0 });
      const words = Array.from({ length: 40 }, (_, i) => `z${i}`).join(' ');
      const answer = c.chat.completions.create({ model: MODEL, temperature: 0, chat_template_kwargs: { thinking: false },
                                                 messages: msg(words) });
      answer.catch(() => {});  // awaited below; a rejection before then is not unhandled
      // SIGTERM once the gateway counts the request as in flight (its own gauge; a deadline, not a fixed wait).
      let inFlight = 0;
      for (const deadline = Date.now() + 30000; inFlight !== 1 && Date.now() < deadline;) {
        inFlight = metricValue(await metricsText(mesh.base), 'dsmesh_gateway_requests_in_flight');
        if (inFlight !== 1) await new Promise((r) => setTimeout(r, 10));
      }
      assertEq(inFlight, 1, 'dsmesh_gateway_requests_in_flight before the signal');
      // Whether the kernel hands the signal to such a thread depends on timing (it killed the gateway in about
      // 1 of 4 tries of this case); the masks show the fault every time.
      const open = threadsTakingShutdownSignals(mesh.gateway.pid);
      assert(open.length === 0, `gateway threads with SIGTERM/SIGINT unblocked: ${open.join(', ')}`);
      const exited = new Promise((r) => mesh.gateway.once('exit', (code) => r(code)));
      mesh.gateway.kill('SIGTERM');
      const r = await answer;
      assertEq(r.choices[0].message.content, words, 'the in-flight request got its whole answer');
      assertEq(r.choices[0].finish_reason, 'stop', 'finish_reason');
      assertEq(await exited, 0, 'exit code');
    } finally { await mesh.stop(); }
  }],

  ['SIGTERM drain waits until a response is written to its last byte (a large non-streamed answer to a slow reader)', async () => {
    // Its generation ends in the mesh (the gauge drops to 0) long before the 11 MB answer, more than the kernel's
    // socket buffers take, has reached a client that does not read yet: the drain must wait for the answer.
    const mesh = await startMesh({ stepMs: 10, tokensPerStep: 1000, maxModelLen: 65536 });
    try {
      const port = Number(mesh.base.split(':').pop());
      const text = '.'.repeat(128 * 30000);  // 30000 tokens of 128 dots each, echoed by the fixture
      const id = 'drain-slow-reader';
      const body = JSON.stringify({ model: MODEL, temperature: 0, n: 3, chat_template_kwargs: { thinking: false }, messages: msg(text) });
      const s = net.connect(port, '127.0.0.1');
      s.pause();  // reads nothing until resumed below
      const chunks = [];
      const ended = new Promise((resolve, reject) => {
        s.on('data', (d) => chunks.push(d));
        s.on('end', resolve);
        s.on('close', resolve);
        s.on('error', reject);
      });
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: ${id}\r\nContent-Type: application/json\r\n` +
              `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
      let inFlight = 0;
      for (const deadline = Date.now() + 30000; inFlight !== 1 && Date.now() < deadline;) {
        inFlight = metricValue(await metricsText(mesh.base), 'dsmesh_gateway_requests_in_flight');
        if (inFlight !== 1) await new Promise((r) => setTimeout(r, 10));
      }
      assertEq(inFlight, 1, 'dsmesh_gateway_requests_in_flight before the signal');
      const exited = new Promise((r) => mesh.gateway.once('exit', (code, signal) => r(signal ?? code)));
      mesh.gateway.kill('SIGTERM');
      // The gateway logs the request's end once its answer is queued; then the mesh lets go of it. A drain that
      // waited only for the mesh would exit within a few of its 20 ms polls of that, cutting the answer: give it
      // a second to do so (a deadline for the fault to show, not a measurement), then read.
      for (const deadline = Date.now() + 30000; !mesh.gatewayLog().includes(`request ${id}: stop`) && Date.now() < deadline;)
        await new Promise((r) => setTimeout(r, 20));
      assert(mesh.gatewayLog().includes(`request ${id}: stop`), 'the gateway finished the request');
      const early = await Promise.race([exited, new Promise((r) => setTimeout(() => r('running'), 1000))]);
      assertEq(early, 'running', 'the gateway, while its answer is still unread');
      s.resume();
      await ended;
      const raw = Buffer.concat(chunks).toString();
      const split = raw.indexOf('\r\n\r\n');
      const head = raw.slice(0, split);
      assert(head.startsWith('HTTP/1.1 200'), `status line: ${head.slice(0, 100)}`);
      const length = Number(head.match(/content-length: (\d+)/i)?.[1]);
      assertEq(Buffer.byteLength(raw.slice(split + 4)), length, 'body bytes (Content-Length)');
      assert(length > 10e6, `an answer larger than socket buffers: ${length} bytes`);
      assert(/^connection: close$/im.test(head), `a response sent while draining closes its connection: ${head}`);
      const answer = JSON.parse(raw.slice(split + 4));
      assertEq(answer.choices.map((c) => c.message.content === text), [true, true, true], 'every choice whole');
      assertEq(await exited, 0, 'exit code');
    } finally { await mesh.stop(); }
  }],
];

await runCases(cases);

#!/usr/bin/env python3
"""tests/gpu/spec_serve.py (run_gpu.sh's specserve part) without a mesh: `measure` against a stand-in
server that answers /v1/models, /v1/chat/completions and /metrics in the gateway's text format, then
`summary` over the runs: acceptance per position and mean accepted length from the counters' change,
PASS when greedy replies match, FAIL when they differ or when a run that must draft counted none.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The checkout's script: it imports training/mtp_acceptance.py beside it, which is not in any package.
ROOT = os.environ.get("DSMESH_ROOT")
if not ROOT:
    sys.exit("FAIL: DSMESH_ROOT is not set; run through ./dsmesh test or export DSMESH_ROOT=<repo root>")
SCRIPT = os.path.join(ROOT, "tests", "gpu", "spec_serve.py")
BASE = 'model_name="m",engine="0"'


class StandIn:
    """Per chat request: 10 drafts of 3 tokens, accepted 8 / 5 / 2 by position, 30 draft passes of
    10 ms, 20 engine steps of 5 ms forward, 20 full draft decisions (all zero with drafts=False)."""

    def __init__(self, drafts=True, greedy_text="same"):
        self.drafts, self.greedy_text, self.requests = drafts, greedy_text, 0
        self.lock = threading.Lock()

    def metrics(self):
        n = self.requests if self.drafts else 0
        lines = [f"vllm:spec_decode_num_drafts_total{{{BASE}}} {10.0 * n}",
                 f"vllm:spec_decode_num_draft_tokens_total{{{BASE}}} {30.0 * n}",
                 f"vllm:spec_decode_num_accepted_tokens_total{{{BASE}}} {15.0 * n}",
                 f"dsmesh_spec_decode_draft_passes_total{{{BASE}}} {30.0 * n}",
                 f"dsmesh_spec_decode_draft_seconds_total{{{BASE}}} {0.3 * n}",
                 f"dsmesh_engine_steps_total{{{BASE}}} {20.0 * self.requests}",
                 f"dsmesh_step_forward_seconds_total{{{BASE}}} {0.1 * self.requests}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{BASE},position="{i}"}} {a * n}.0'
                  for i, a in enumerate([8, 5, 2])]
        lines += [f'vllm:spec_decode_draft_decisions_total{{{BASE},decision="{d}"}} {v}.0'
                  for d, v in [("full", 20 * n), ("off", 0)]]
        return "\n".join(lines) + "\n"

    def chat(self, body):
        with self.lock:
            self.requests += 1
        greedy = body["temperature"] == 0
        text = f"{self.greedy_text}: {body['messages'][0]['content']}" if greedy else f"sampled {body['seed']}"
        return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": {"completion_tokens": body["max_tokens"], "prompt_tokens": 5}}


def serve(stand_in):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, payload, kind="application/json"):
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/v1/models":
                self.reply({"data": [{"id": "m"}]})
            else:
                self.reply(stand_in.metrics(), "text/plain")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.reply(stand_in.chat(body))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class SpecServeTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def measure(self, label, stand_in, *flags):
        server = serve(stand_in)
        out = os.path.join(self.dir, label + ".json")
        try:
            subprocess.run([sys.executable, SCRIPT, "measure", "--url", f"http://127.0.0.1:{server.server_port}",
                            "--label", label, "--out", out, "--max-tokens", "16", "--repeat", "2", *flags],
                           check=True, capture_output=True, timeout=60)
        finally:
            server.shutdown()
            server.server_close()
        return out

    def summary(self, off, *ons):
        text = os.path.join(self.dir, "specserve.txt")
        if os.path.exists(text):
            os.remove(text)
        r = subprocess.run([sys.executable, SCRIPT, "summary", "--off", off, "--text", text, *ons],
                           capture_output=True, text=True, timeout=60)
        if r.stdout:  # the block printed is the block written
            self.assertEqual(r.stdout, open(text).read())
        return r

    def test_acceptance_per_position_and_greedy_match(self):
        off = self.measure("off", StandIn(drafts=False))
        fixed = self.measure("fixed", StandIn(), "--expect-drafts")
        r = self.summary(off, fixed)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # 8 prompts x 2 runs = 16 requests per set: 160 drafts, accepted 128 / 80 / 32 by position.
        self.assertIn("mean accepted length 2.500 (240 of 480 draft tokens accepted, 160 drafts)", r.stdout)
        self.assertIn("acceptance per position 0.800 / 0.500 / 0.200", r.stdout)
        self.assertIn("10.000 ms per pass, 15.000 ms per engine step; forward 5.000 ms per engine step", r.stdout)
        self.assertIn("draft policy decisions: full 320", r.stdout)
        self.assertIn("greedy replies of fixed run 2 equal to off run 1: 8 of 8", r.stdout)
        self.assertNotIn("FAIL", r.stdout)
        run = json.load(open(fixed))["sets"]["greedy"][0]
        self.assertEqual(run["tokens"], 8 * 16)
        self.assertEqual(run["counters"]["num_drafts"], 80)

    def test_greedy_replies_that_differ_fail(self):
        off = self.measure("off", StandIn(drafts=False))
        fixed = self.measure("fixed", StandIn(greedy_text="other"), "--expect-drafts")
        r = self.summary(off, fixed)
        self.assertEqual(r.returncode, 1)
        self.assertIn("greedy replies of fixed run 1 equal to off run 1: 0 of 8  FAIL", r.stdout)

    def test_no_drafts_fails_only_where_every_draft_is_proposed(self):
        off = self.measure("off", StandIn(drafts=False))
        adaptive = self.measure("adaptive", StandIn(drafts=False))
        r = self.summary(off, adaptive)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("no drafts counted", r.stdout)
        fixed = self.measure("fixed", StandIn(drafts=False), "--expect-drafts")
        r = self.summary(off, fixed)
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAIL: this policy proposes every draft", r.stdout)

    def test_unreachable_server_and_missing_file_are_clear_errors(self):
        r = subprocess.run([sys.executable, SCRIPT, "measure", "--url", "http://127.0.0.1:9", "--label", "x",
                            "--out", os.path.join(self.dir, "x.json")], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertTrue(r.stderr.startswith("spec_serve: measure: "), r.stderr)
        r = self.summary(os.path.join(self.dir, "absent.json"), os.path.join(self.dir, "absent.json"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("No such file", r.stderr)


if __name__ == "__main__":
    unittest.main()

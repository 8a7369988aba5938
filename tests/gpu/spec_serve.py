#!/usr/bin/env python3
"""Speculative decoding as a client of `dsmesh up` sees it: tok/s with and without speculation, and the MTP
drafts' acceptance per position from the gateway's vLLM counters (vllm:spec_decode_*). tests/gpu/run_gpu.sh's
`specserve` part starts the meshes and calls this (stdlib only).

    spec_serve.py measure --url http://127.0.0.1:PORT --label fixed --out fixed.json [--max-tokens 128]
                          [--repeat 2] [--streams 1]
    spec_serve.py summary --off off.json [--text specserve.txt] ON.json...

measure: the same chat completions on every run, two sets of them: greedy (temperature 0) and sampled
(temperature 0.7, a seed per prompt), each ignore_eos so that every request generates --max-tokens tokens.
One warm-up request per set goes first (CUDA graphs are captured while a shape is new) and is not counted.
Each set runs --repeat times; every run scrapes /metrics before and after it and keeps the counters' change,
the completion tokens (usage.completion_tokens), the client's wall time and the replies' messages.
--expect-drafts (a run under --draft-policy fixed, which proposes every draft) makes a run that counted no
drafts a failure; the adaptive policy may rightly propose none where drafts do not pay.

summary: per set, tok/s of every run (the best of its repeats, and all of them) beside the --off run's and
their ratio; for every run with drafts the mean accepted length (1 + accepted / drafts, vLLM's mean
acceptance length), the acceptance per position (accepted at position i / drafts), ms of draft passes per
pass and per engine step, ms of forward per engine step, and the draft policy's decisions. Exit status 1
when a run's greedy replies (message content and reasoning, completion tokens) differ from the --off run's
(speculation must not change greedy output; the text after an end of sentence is not in a chat reply, so
the tokens after one are timed but not compared) or when a run with --expect-drafts counted no drafts; the
summary says which.
"""
import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "training"))
from mtp_acceptance import metrics  # noqa: E402  (the /metrics parser training/mtp_acceptance.py uses)

# Varied text: the trained default model's own kind of question (definitions, small talk) and free text.
PROMPTS = [
    "What does 'harbour' mean?",
    "Tell me a story about a ship that sailed across the sea at night.",
    "Explain the word 'happy'.",
    "Write a short poem about rain falling on a quiet town.",
    "Can you tell me what 'mountain' means?",
    "Describe how a river carves a valley over thousands of years.",
    "Hello! Who are you?",
    "List some things people do on a sunny afternoon in the park.",
]
# No logprobs: a sequence that returns them does not speculate (coordinator/scheduler.cc).
SETS = {"greedy": {"temperature": 0}, "sampled": {"temperature": 0.7}}


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))


def request_body(model, prompt_index, params, max_tokens):
    body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[prompt_index]}],
            "max_tokens": max_tokens, "ignore_eos": True, **params}
    if body["temperature"] > 0:
        body["seed"] = 1000 + prompt_index
    return body


def draft_decisions(url):
    """The draft policy's decisions so far, by kind: vllm:spec_decode_draft_decisions_total{decision=...}."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^vllm:spec_decode_draft_decisions_total\{[^}]*decision="(\w+)"[^}]*\} ([0-9.e+-]+)$', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def run_set(url, model, params, max_tokens, streams):
    before, decisions_before = metrics(url), draft_decisions(url)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=streams) as pool:
        replies = list(pool.map(lambda i: post(url, request_body(model, i, params, max_tokens)), range(len(PROMPTS))))
    seconds = time.monotonic() - t0
    after, decisions_after = metrics(url), draft_decisions(url)
    return {"seconds": seconds,
            "tokens": sum(r["usage"]["completion_tokens"] for r in replies),
            "messages": [r["choices"][0]["message"] for r in replies],
            "completion_tokens": [r["usage"]["completion_tokens"] for r in replies],
            "counters": {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after},
            "decisions": {k: v - decisions_before.get(k, 0.0) for k, v in decisions_after.items()}}


def measure(a):
    model = json.load(urllib.request.urlopen(a.url + "/v1/models", timeout=30))["data"][0]["id"]
    result = {"label": a.label, "expect_drafts": a.expect_drafts, "model": model, "max_tokens": a.max_tokens, "streams": a.streams,
              "prompts": len(PROMPTS), "sets": {}}
    for name, params in SETS.items():
        post(a.url, request_body(model, 0, params, a.max_tokens))  # warm-up, not counted
        runs = []
        for r in range(a.repeat):
            runs.append(run_set(a.url, model, params, a.max_tokens, a.streams))
            print(f"[spec_serve] {a.label} {name} run {r + 1}/{a.repeat}: {runs[-1]['tokens']} tokens in "
                  f"{runs[-1]['seconds']:.2f} s", file=sys.stderr, flush=True)
        result["sets"][name] = runs
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


def tok_s(run):
    return run["tokens"] / run["seconds"] if run["seconds"] > 0 else 0.0


def summed(runs, key):
    total = {}
    for run in runs:
        for k, v in run[key].items():
            total[k] = total.get(k, 0.0) + v
    return total


def acceptance_lines(c):
    """The speculation lines of one set's summed counters; empty when it counted no drafts."""
    drafts = c.get("num_drafts", 0.0)
    if drafts <= 0:
        return []
    positions = sorted((int(k.split("[")[1].rstrip("]")), v) for k, v in c.items()
                       if k.startswith("num_accepted_tokens_per_pos["))
    steps = max(c.get("engine_steps", 0.0), 1.0)
    passes = c.get("spec_decode_draft_passes", 0.0)
    return [
        f"mean accepted length {1 + c.get('num_accepted_tokens', 0.0) / drafts:.3f} "
        f"({c.get('num_accepted_tokens', 0.0):.0f} of {c.get('num_draft_tokens', 0.0):.0f} draft tokens accepted, "
        f"{drafts:.0f} drafts)",
        "acceptance per position " + " / ".join(f"{v / drafts:.3f}" for _, v in positions),
        f"draft passes {passes:.0f}: {1e3 * c.get('spec_decode_draft_seconds', 0.0) / max(passes, 1.0):.3f} ms per "
        f"pass, {1e3 * c.get('spec_decode_draft_seconds', 0.0) / steps:.3f} ms per engine step; forward "
        f"{1e3 * c.get('step_forward_seconds', 0.0) / steps:.3f} ms per engine step ({steps:.0f} steps, prefill "
        f"steps included)",
    ]


def summary(a):
    off = json.load(open(a.off))
    ons = [json.load(open(p)) for p in a.on]
    lines = [f"speculation served: model {off['model']}, {off['prompts']} chat prompts x {off['max_tokens']} tokens "
             f"(ignore_eos), {off['streams']} stream(s); tok/s = completion tokens / client wall time, best of "
             f"{len(off['sets']['greedy'])} run(s)"]
    ok = True
    for name in SETS:
        base = max(tok_s(r) for r in off["sets"][name])
        lines.append(f"-- {name} ({', '.join(f'{k} {v}' for k, v in SETS[name].items())})")
        lines.append(f"off: {base:.1f} tok/s (runs: {', '.join(f'{tok_s(r):.1f}' for r in off['sets'][name])})")
        for on in ons:
            best = max(tok_s(r) for r in on["sets"][name])
            lines.append(f"{on['label']}: {best:.1f} tok/s, {best / base if base else 0:.3f}x off "
                         f"(runs: {', '.join(f'{tok_s(r):.1f}' for r in on['sets'][name])})")
            spec = acceptance_lines(summed(on["sets"][name], "counters"))
            if not spec:
                lines.append(f"  no drafts counted (vllm:spec_decode_num_drafts)"
                             + ("  FAIL: this policy proposes every draft" if on["expect_drafts"] else ""))
                ok = ok and not on["expect_drafts"]
            lines += ["  " + s for s in spec]
            decisions = summed(on["sets"][name], "decisions")
            lines.append("  draft policy decisions: " + (", ".join(f"{k} {v:.0f}" for k, v in sorted(decisions.items())
                                                                   if v) or "none"))
    first = off["sets"]["greedy"][0]
    want = list(zip(first["messages"], first["completion_tokens"]))
    for run in [off] + ons:
        for i, r in enumerate(run["sets"]["greedy"]):
            same = sum(x == y for x, y in zip(zip(r["messages"], r["completion_tokens"]), want))
            if same != len(want):
                ok = False
            lines.append(f"greedy replies of {run['label']} run {i + 1} equal to off run 1: {same} of {len(want)}"
                         + ("" if same == len(want) else "  FAIL"))
    text = "\n".join(lines)
    print(text)
    if a.text:
        with open(a.text, "w") as f:
            f.write(text + "\n")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--url", required=True)
    m.add_argument("--label", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--max-tokens", type=int, default=128)
    m.add_argument("--repeat", type=int, default=2)
    m.add_argument("--streams", type=int, default=1)
    m.add_argument("--expect-drafts", action="store_true")
    s = sub.add_parser("summary")
    s.add_argument("--off", required=True)
    s.add_argument("--text")
    s.add_argument("on", nargs="+")
    a = ap.parse_args()
    try:
        if a.command == "measure":
            if a.repeat < 1 or a.streams < 1 or a.max_tokens < 1:
                ap.error("--repeat, --streams and --max-tokens must be >= 1")
            measure(a)
            return 0
        return summary(a)
    except urllib.error.HTTPError as e:
        sys.exit(f"spec_serve: {e.url}: HTTP {e.code}: {e.read().decode(errors='replace')[:500]}")
    except (OSError, ValueError, KeyError, IndexError) as e:
        sys.exit(f"spec_serve: {a.command}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    sys.exit(main())

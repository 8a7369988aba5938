#!/usr/bin/env python3
"""Speculative decoding as a client of `dsmesh up` sees it: tok/s with and without speculation, and the MTP
drafts' acceptance per position from the gateway's vLLM counters (vllm:spec_decode_*). tests/gpu/run_gpu.sh's
`specserve` part starts the meshes and calls this (stdlib only).

    spec_serve.py measure --url http://127.0.0.1:PORT --label fixed --out fixed.json [--max-tokens 128]
                          [--repeat 2] [--streams 1]
    spec_serve.py summary --off off.json [--text specserve.txt] ON.json...

measure: the same chat completions on every run, two sets of them: greedy (temperature 0, with logprobs for
the generated tokens) and sampled (temperature 0.7, a seed per prompt), each ignore_eos so that every
request generates --max-tokens tokens.
One warm-up request per set goes first (CUDA graphs are captured while a shape is new) and is not counted.
Each set runs --repeat times; every run scrapes /metrics before and after it and keeps the counters' change,
the completion tokens (usage.completion_tokens), the client's wall time, the replies' text and tokens.

summary: per set, tok/s of every run (the best of its repeats, and all of them) beside the --off run's and
their ratio; for every run with drafts the mean accepted length (1 + accepted / drafts, vLLM's mean
acceptance length), the acceptance per position (accepted at position i / drafts), ms of draft passes per
pass and per engine step, ms of forward per engine step. Exit status 1 when a run's greedy replies (their
generated tokens and text) differ from the --off run's (speculation must not change greedy output) or when a run that speculated counted no
drafts; the summary says which.
"""
import argparse
import json
import os
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
# The greedy set asks for logprobs: their tokens are every generated token, the ones after an end of sentence
# (ignore_eos) included, which the reply's text leaves out; the on / off comparison is over those tokens.
SETS = {"greedy": {"temperature": 0, "logprobs": True}, "sampled": {"temperature": 0.7}}


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


def run_set(url, model, params, max_tokens, streams):
    before = metrics(url)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=streams) as pool:
        replies = list(pool.map(lambda i: post(url, request_body(model, i, params, max_tokens)), range(len(PROMPTS))))
    seconds = time.monotonic() - t0
    after = metrics(url)
    return {"seconds": seconds,
            "tokens": sum(r["usage"]["completion_tokens"] for r in replies),
            "tokens_out": [[t["token"] for t in (r["choices"][0].get("logprobs") or {}).get("content") or []]
                           for r in replies],
            "texts": [r["choices"][0]["message"].get("content") for r in replies],
            "counters": {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}}


def measure(a):
    model = json.load(urllib.request.urlopen(a.url + "/v1/models", timeout=30))["data"][0]["id"]
    result = {"label": a.label, "model": model, "max_tokens": a.max_tokens, "streams": a.streams,
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


def summed_counters(runs):
    total = {}
    for run in runs:
        for k, v in run["counters"].items():
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
            spec = acceptance_lines(summed_counters(on["sets"][name]))
            if not spec:
                ok = False
                lines.append(f"  FAIL: the {on['label']} run counted no drafts (vllm:spec_decode_num_drafts)")
            lines += ["  " + s for s in spec]
    first = off["sets"]["greedy"][0]
    want = list(zip(first["tokens_out"], first["texts"]))
    if not all(len(t) == off["max_tokens"] for t in first["tokens_out"]):
        ok = False
        lines.append("FAIL: the off run's greedy replies do not list every generated token (logprobs)")
    for run in [off] + ons:
        for i, r in enumerate(run["sets"]["greedy"]):
            same = sum(x == y for x, y in zip(zip(r["tokens_out"], r["texts"]), want))
            if same != len(want):
                ok = False
            lines.append(f"greedy replies (tokens and text) of {run['label']} run {i + 1} equal to off run 1: "
                         f"{same} of {len(want)}"
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

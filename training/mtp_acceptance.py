#!/usr/bin/env python3
"""MTP speculative acceptance of a served model on held-out text, per draft position, read from the
gateway's vLLM counters (vllm:spec_decode_*) around greedy completions of held-out prompts.

    dsmesh up --model MODEL --speculative-config '{"method":"mtp","num_speculative_tokens":3}' --draft-policy fixed ...

(--draft-policy fixed: every step proposes all drafts, so the counters measure the MTP head itself; the
adaptive default proposes fewer where they do not pay, which lowers the later positions' rates.)
    python3 training/mtp_acceptance.py --url http://127.0.0.1:8000 --file HELDOUT.txt [--prompts 24] [--tokens 64]

Prompts are consecutive 1,200-character pieces of the file, cut at a space; each is continued for --tokens
tokens at temperature 0 (ignore_eos). Prints one JSON object: drafts, draft tokens, accepted tokens,
acceptance rate per position, the acceptance length 1 + accepted / drafts (vLLM's mean acceptance length),
and the drafts' cost: rank 0's ms per MTP draft pass (dsmesh_spec_decode_draft_* counters) and ms of
forward per engine step (dsmesh_step_forward_seconds; prefill steps included).
"""
import argparse
import json
import re
import sys
import urllib.request


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(?:dsmesh_)?(spec_decode_draft_\w+|step_forward_seconds|engine_steps)_total(\{[^}]*\})? '
                     r'([0-9.e+-]+)$', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            continue
        m = re.match(r'^vllm:spec_decode_(num_\w+?)_total(\{[^}]*\})? ([0-9.e+-]+)$', line)
        if not m:
            continue
        pos = re.search(r'position="(\d+)"', m.group(2) or "")
        key = m.group(1) + (f"[{pos.group(1)}]" if pos else "")
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    text = open(a.file, encoding="utf-8").read()
    model = json.load(urllib.request.urlopen(a.url + "/v1/models", timeout=30))["data"][0]["id"]
    before = metrics(a.url)
    pos, n = 0, 0
    while n < a.prompts and pos < len(text):
        end = text.rfind(" ", pos, pos + 1200)
        end = end if end > pos else pos + 1200
        prompt = text[pos:end]
        pos = end + 1
        body = {"model": model, "prompt": prompt, "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True}
        req = urllib.request.Request(a.url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        json.load(urllib.request.urlopen(req, timeout=600))
        n += 1
        print(f"[mtp_acceptance] prompt {n}/{a.prompts}", file=sys.stderr, flush=True)
    after = metrics(a.url)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts = d.get("num_drafts", 0.0)
    if drafts <= 0:
        sys.exit("mtp_acceptance: no drafts were counted: is the server running with --speculative-config?")
    per_pos = {k: v / drafts for k, v in sorted(d.items()) if k.startswith("num_accepted_tokens_per_pos")}
    print(json.dumps({"model": model, "prompts": n, "tokens_each": a.tokens, "drafts": drafts,
                      "draft_tokens": d.get("num_draft_tokens", 0.0), "accepted": d.get("num_accepted_tokens", 0.0),
                      "acceptance_rate_per_position": {k.split("[")[1].rstrip("]"): round(v, 4)
                                                       for k, v in per_pos.items()},
                      "acceptance_length": round(1 + d.get("num_accepted_tokens", 0.0) / drafts, 4),
                      "draft_passes": d.get("spec_decode_draft_passes", 0.0),
                      "draft_ms_per_pass": round(1e3 * d.get("spec_decode_draft_seconds", 0.0) /
                                                 max(d.get("spec_decode_draft_passes", 0.0), 1), 3),
                      "forward_ms_per_step": round(1e3 * d.get("step_forward_seconds", 0.0) /
                                                   max(d.get("engine_steps", 0.0), 1), 3)}))


if __name__ == "__main__":
    main()

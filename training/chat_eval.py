#!/usr/bin/env python3
"""Held-out definition questions (chat_test.jsonl from prepare_data.py: words no training turn defined)
asked through a served model's chat API, greedy, thinking off. Counts answers in the trained form that name
the asked word, and answers containing one of the gloss's content words.

    python3 training/chat_eval.py --url http://127.0.0.1:8000 --file .data/corpus/chat_test.jsonl [--n 100]
"""
import argparse
import json
import re
import sys
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--n", type=int, default=100)
    a = ap.parse_args()
    model = json.load(urllib.request.urlopen(a.url + "/v1/models"))["data"][0]["id"]
    rows = [json.loads(l) for l in open(a.file)][: a.n]
    named = keyword = 0
    for i, r in enumerate(rows):
        body = {"model": model, "messages": [{"role": "user", "content": r["question"]}], "max_tokens": 48,
                "temperature": 0}
        req = urllib.request.Request(a.url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["message"]["content"] or ""
        m = re.match(r"""^The word (['"]?)([A-Za-z' -]+?)\1 is an? """, answer)
        named += bool(m) and m.group(2) == r["word"]
        gloss = answer.split(" meaning ", 1)[-1].lower()
        keyword += any(re.search(r"\b" + re.escape(k) + r"\b", gloss) for k in r["keywords"])
        print(f"[chat_eval] {i + 1}/{len(rows)} {r['question']!r} -> {answer[:90]!r}", file=sys.stderr)
    print(json.dumps({"model": model, "questions": len(rows), "names_the_word": named,
                      "gloss_keyword": keyword}))


if __name__ == "__main__":
    main()

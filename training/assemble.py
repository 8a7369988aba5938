#!/usr/bin/env python3
"""Rebuilds the full bf16 checkpoint from train.py's export (trained rows + the fixed frozen rows, the
hash tables from seed 1234) in DeepSeek naming, with config.json and the V4 tokenizer files.

    python3 training/assemble.py --run RUN_DIR --out MODEL_DIR
"""
import argparse
import glob
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4  # noqa: E402
import st  # noqa: E402
from train import frozen_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default="common/tokenizer/data/deepseek_v4")
    a = ap.parse_args()
    t = {}
    for p in sorted(glob.glob(os.path.join(a.run, "trained-*.safetensors"))):
        t.update(st.load(p))
    args = dsv4.Args()
    seen = t.pop("trained_rows").long()
    V, D = args.vocab_size, args.dim
    unseen = torch.ones(V, dtype=torch.bool)
    unseen[seen] = False
    uidx = unseen.nonzero().squeeze(-1)
    for name in ("embed.weight", "head.weight"):
        full = torch.empty(V, D, dtype=torch.bfloat16)
        full[seen] = t[name]
        full[uidx] = frozen_rows(uidx, D).to(torch.bfloat16)
        t[name] = full
    ref = dsv4.Transformer(args)  # for the hash tables (dsv4.Gate, seed 1234)
    for i, layer in enumerate(ref.layers):
        if layer.ffn.gate.hash:
            t[f"layers.{i}.ffn.gate.tid2eid"] = layer.ffn.gate.tid2eid.to(torch.int32)
    os.makedirs(a.out, exist_ok=True)
    st.save(os.path.join(a.out, "model.safetensors"), t, {"format": "pt"})
    json.dump(args.config_json(), open(os.path.join(a.out, "config.json"), "w"), indent=2)
    for f in os.listdir(a.tokenizer):
        shutil.copy(os.path.join(a.tokenizer, f), a.out)
    print(f"wrote {a.out}: {len(t)} tensors")


if __name__ == "__main__":
    main()

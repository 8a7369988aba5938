#!/usr/bin/env python3
"""Our C++ forward (`dsmesh logits`) vs training/dsv4.py on the same bf16 checkpoint, and the torch
held-out perplexity (`dsmesh ppl` semantics) of that checkpoint.

    python3 training/compare_cpp.py --model MODEL_DIR --ids IDS.json [--n 256] [--ppl]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4  # noqa: E402
import st  # noqa: E402


def load(model_dir):
    args = dsv4.Args()
    m = dsv4.Transformer(args).float().eval()
    t = st.load(os.path.join(model_dir, "model.safetensors"))
    missing = dsv4.load_ds(m, {k: v.float() if v.is_floating_point() else v for k, v in t.items()})
    assert not missing, missing
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--dsmesh", default="bazel-bin/cli/dsmesh")
    ap.add_argument("--ppl", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(2)
    ids = json.load(open(a.ids))["ids"]
    m = load(a.model)
    x = torch.tensor(ids[: a.n])[None]
    with torch.no_grad():
        ref = m(x, mtp=False)[0][0]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.safetensors")
        subprocess.run([a.dsmesh, "logits", "--model", a.model, "--tokens", ",".join(map(str, ids[: a.n])),
                        "--out", out], check=True)
        got = st.load(out)["logits"].float()
    rel = ((got - ref).norm() / ref.norm()).item()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(json.dumps({"tokens": a.n, "rel_l2": rel, "max_abs": (got - ref).abs().max().item(), "argmax_agree": agree}))
    if a.ppl:
        ctx = 512
        n = len(ids) // ctx
        xs = torch.tensor(ids[: n * ctx]).view(n, ctx)
        nll, cnt, hit, mc = 0.0, 0, 0, 0
        with torch.no_grad():
            for i in range(0, n, 4):
                xb = xs[i: i + 4]
                lg, ml, _ = m(xb)
                nll += F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), xb[:, 1:].reshape(-1), reduction="sum").item()
                cnt += xb[:, 1:].numel()
                p = ml.argmax(-1)
                hit += (p[:, :-1] == xb[:, 2:]).sum().item()
                mc += p[:, :-1].numel()
        print(json.dumps({"torch_ppl_ctx512": math.exp(nll / cnt), "windows": n, "scored": cnt, "mtp_top1": hit / mc}))


if __name__ == "__main__":
    main()

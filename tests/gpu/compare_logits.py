#!/usr/bin/env python3
"""Compares logits written by `dsmesh logits` with the golden fixture's transformers logits.
usage: compare_logits.py GOLDEN.safetensors KEY GOT.safetensors MAX_REL_L2
Prints the worst per-row relative L2 and exits 1 when it is above MAX_REL_L2."""
import sys

from safetensors.numpy import load_file

golden, key, got_path, bound = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
want = load_file(golden)[key].astype("float64")
got = load_file(got_path)["logits"].astype("float64")
want = want.reshape(-1, want.shape[-1])[: got.shape[0]]
num = ((got - want) ** 2).sum(axis=1) ** 0.5
den = (want ** 2).sum(axis=1) ** 0.5
worst = float((num / den).max())
print(f"{got_path}: {got.shape[0]} rows, worst rel L2 vs transformers = {worst:.3g} (bound {bound})")
sys.exit(0 if worst <= bound else 1)

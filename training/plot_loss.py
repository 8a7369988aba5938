#!/usr/bin/env python3
"""Loss curves of the training runs: python3 training/plot_loss.py OUT.png RUN_LOSS.jsonl[@OFFSET_M] [...]
A run that continues another (train.py --init) is drawn after it: @OFFSET_M shifts it by that many M tokens."""
import json
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
for arg in sys.argv[2:]:
    path, _, off = arg.partition("@")
    rows = [json.loads(l) for l in open(path)]
    for r in rows:
        r["tokens"] += float(off or 0) * 1e6
    tag = path.split("/")[-1].replace("-loss.jsonl", "")
    ax[0].plot([r["tokens"] / 1e6 for r in rows], [r["loss"] for r in rows], label=f"{tag} train (batch)")
    ax[0].plot([r["tokens"] / 1e6 for r in rows], [r["mtp_loss"] for r in rows], ":", label=f"{tag} MTP (t+2)")
    ev = [r for r in rows if "heldout" in r]
    for s in ("sotu", "pydoc", "chat"):
        ax[1].plot([r["tokens"] / 1e6 for r in ev], [r["heldout"][s] for r in ev], marker="o", label=f"{tag} {s}")
for a, t in zip(ax, ("training loss (nats/token)", "held-out loss (nats/token)")):
    a.set_xlabel("training tokens (M)")
    a.set_title(t)
    a.grid(alpha=0.3)
    a.legend(fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[1], dpi=90)

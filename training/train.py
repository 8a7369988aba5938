#!/usr/bin/env python3
"""Trains the default model (docs/trained-model.md) on one GPU within a wall-clock budget, then evaluates
and exports it. Everything lands in --out (loss log, held-out figures, the weights in shards <= 15 MB).

    python3 training/train.py --corpus CORPUS_DIR --out OUT [--minutes 6.5] [--seed 20] [--device cuda]

The embedding and head rows of tokens that never occur in the training split are frozen at a fixed
arithmetic pattern (frozen_rows), so they need not travel: export writes only the trained rows and
training/assemble.py rebuilds the full tables bit for bit.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4  # noqa: E402
import st  # noqa: E402

SOURCES = ["sotu", "factbook", "bible", "pydoc", "pycode", "wordnet", "chat"]


def frozen_rows(rows, dim):
    """The fixed values of untrained embedding/head rows: 1e-3 * a sawtooth in (-1, 1) of (row, col)."""
    i = torch.as_tensor(rows, dtype=torch.int64)[:, None]
    j = torch.arange(dim, dtype=torch.int64)[None, :]
    return (((i * 7919 + j * 104729) % 1000).double() / 500.0 - 1.0).mul(1e-3).float()


def log(*a):
    print(*a, flush=True)


class Data:
    def __init__(self, corpus, split, device):
        self.streams = {}
        for s in SOURCES:
            a = np.fromfile(os.path.join(corpus, f"ids_{split}_{s}.u32"), dtype=np.uint32).astype(np.int64)
            self.streams[s] = torch.from_numpy(a)
        self.device = device

    def batch(self, gen, weights, B, S):
        return self.batch_cpu(gen, weights, B, S).to(self.device, non_blocking=True)

    def batch_cpu(self, gen, weights, B, S):
        names = list(weights)
        p = torch.tensor([weights[n] for n in names], dtype=torch.float64)
        src = torch.multinomial(p, B, replacement=True, generator=gen)
        rows = []
        for k in src.tolist():
            s = self.streams[names[k]]
            # A window starts anywhere in the stream (documents lie back to back, BOS ... EOS), so every
            # token of a long document is trained on, not only each document's first S tokens.
            start = int(torch.randint(len(s) - S, (1,), generator=gen))
            rows.append(s[start: start + S + 1])
        return torch.stack(rows)


def lr_at(frac, step, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def indexer_kl(model):
    tot, n = 0.0, 0
    for layer in model.layers:
        aux = layer.attn.aux
        if "indexer_score" not in aux:
            continue
        score, valid = aux["indexer_score"], aux["indexer_valid"]  # [B,S,N], [S,N]
        target = aux["attn_comp"]  # [B,S,N] dense attention over the available entries (detached)
        rows = valid.any(-1)  # queries with at least one entry
        if rows.sum() == 0:
            continue
        t = target[:, rows] + 1e-9
        t = t / t.sum(-1, keepdim=True)
        logp = torch.log_softmax(score[:, rows].float(), -1).masked_fill(~valid[rows][None], 0.0)
        tot = tot + (t * (torch.log(t) - logp)).masked_fill(~valid[rows][None], 0.0).sum(-1).mean()
        n += 1
    return tot / max(n, 1)


@torch.no_grad()
def evaluate(model, windows, dt_ctx):
    """Mean NLL (nats/token) of main head and MTP head top-1 accuracy over [n, S+1] windows, first token skipped."""
    model.eval()
    nll, cnt, mtp_hit, mtp_cnt = 0.0, 0, 0, 0
    for i in range(0, len(windows), 8):
        x = windows[i: i + 8]
        with dt_ctx():
            logits, mlog, _ = model(x[:, :-1])
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1),
                               reduction="sum").item()
        cnt += x[:, 1:].numel()
        if mlog is not None:
            # MTP row t (t = 0 .. S-2) predicts token t+2
            pred = mlog.argmax(-1)
            mtp_hit += (pred[:, :-1] == x[:, 2:-1]).sum().item()
            mtp_cnt += pred[:, :-1].numel()
    model.train()
    return nll / cnt, (mtp_hit / mtp_cnt if mtp_cnt else float("nan"))


@torch.no_grad()
def ppl_disjoint(model, ids, ctx, dt_ctx, device):
    """`dsmesh ppl` semantics: disjoint windows of ctx tokens, each scored from its 2nd token on."""
    n = len(ids) // ctx
    x = torch.tensor(ids[: n * ctx], dtype=torch.long, device=device).view(n, ctx)
    model.eval()
    nll, cnt, hit, mcnt = 0.0, 0, 0, 0
    for i in range(0, n, 8):
        xb = x[i: i + 8]
        with dt_ctx():
            logits, mlog, _ = model(xb)
        nll += F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), xb[:, 1:].reshape(-1),
                               reduction="sum").item()
        cnt += xb[:, 1:].numel()
        pred = mlog.argmax(-1)  # row t predicts t+2
        hit += (pred[:, :-1] == xb[:, 2:]).sum().item()
        mcnt += pred[:, :-1].numel()
    model.train()
    return math.exp(nll / cnt), n, cnt, hit / mcnt


def export(model, seen, out_dir, limit=16_000_000):
    tensors = dsv4.export_tensors(model)
    tensors["embed.weight"] = tensors["embed.weight"][seen]
    tensors["head.weight"] = tensors["head.weight"][seen]
    tensors["trained_rows"] = torch.as_tensor(seen, dtype=torch.int32)
    for k in [k for k in tensors if k.endswith("tid2eid")]:
        del tensors[k]  # fixed tables: dsv4.Gate rebuilds them from seed 1234
    shards, cur, size = [], {}, 0
    for k, v in tensors.items():
        b = v.numel() * v.element_size()
        if cur and size + b > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += b
    shards.append(cur)
    for i, s in enumerate(shards):
        st.save(os.path.join(out_dir, f"trained-{i}.safetensors"), s, {"format": "pt"})
    return len(shards)


def load_export(model, run_dir, seen):
    """Loads train.py's export (trained rows of embedding and head, every block tensor) into `model`."""
    import glob
    t = {}
    for p in sorted(glob.glob(os.path.join(run_dir, "trained-*.safetensors"))):
        t.update(st.load(p))
    rows = t.pop("trained_rows").long()
    if not torch.equal(rows, torch.as_tensor(seen, dtype=torch.long)):
        sys.exit(f"{run_dir}: its trained rows differ from this corpus's seen.npy (another corpus?)")
    with torch.no_grad():
        for name in ("embed.weight", "head.weight"):
            full = dict(model.named_parameters())[name]
            full[rows] = t.pop(name).to(full.dtype)
    missing = dsv4.load_ds(model, {k: v.float() if v.is_floating_point() else v for k, v in t.items()})
    missing -= {"embed.weight", "head.weight"}
    missing = {k for k in missing if not k.endswith("tid2eid")}
    if missing:
        sys.exit(f"{run_dir}: the export lacks {sorted(missing)[:5]}")


# Chat token ids (the V4 tokenizer's specials).
USER_ID, ASSIST_ID, EOS_ID = 128803, 128804, 1


def copy_weights(x, weight):
    """[B, S] loss weights (CPU) for the targets x[:, 1:] of a CPU batch: `weight` for a token of an
    assistant turn that also occurs in the same turn's user text (the asked word, copied into the answer),
    1 elsewhere. Teaches the copy that a definition answer starts with, which a few million tokens of text
    alone do not."""
    xs = x.numpy()
    w = np.ones((xs.shape[0], xs.shape[1] - 1), dtype=np.float32)
    for b in range(xs.shape[0]):
        row = xs[b]
        users = np.nonzero(row == USER_ID)[0]
        for u in users:
            rest = row[u + 1:]
            a = np.nonzero(rest == ASSIST_ID)[0]
            if not len(a):
                break
            a0 = u + 1 + a[0]
            e = np.nonzero(row[a0 + 1:] == EOS_ID)[0]
            a1 = a0 + 1 + e[0] if len(e) else len(row)
            question = set(row[u + 1:a0].tolist())
            for t in range(a0 + 1, a1):
                if row[t] in question:
                    w[b, t - 1] = weight  # target index t-1 predicts row[t]
    return torch.from_numpy(w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=6.5)
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--chat-frac", type=float, default=0.15, help="final fraction of the time in the chat stage")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--init", default="", help="continue from an export of an earlier run (same corpus)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--copy-weight", type=float, default=1.0,
                    help="loss weight of answer tokens that copy a token of the same turn's question")
    ap.add_argument("--small", action="store_true", help="CPU smoke test: tiny batch")
    a = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    dev = torch.device(a.device)
    os.makedirs(a.out, exist_ok=True)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def dt_ctx():
        return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    args = dsv4.Args()
    model = dsv4.Transformer(args)
    seen = np.load(os.path.join(a.corpus, "seen.npy"))
    unseen = np.setdiff1d(np.arange(args.vocab_size), seen)
    with torch.no_grad():
        model.embed.weight[unseen] = frozen_rows(unseen, args.dim)
        model.head.weight[unseen] = frozen_rows(unseen, args.dim)
    if a.init:
        load_export(model, a.init, seen)
        log(f"initialised from {a.init}")
    mask = torch.zeros(args.vocab_size, 1)
    mask[torch.as_tensor(seen, dtype=torch.long)] = 1.0
    model = model.to(dev)
    mask = mask.to(dev)
    model.embed.weight.register_hook(lambda g: g * mask)
    model.head.weight.register_hook(lambda g: g * mask)
    n_params = sum(p.numel() for p in model.parameters())
    n_emb = model.embed.weight.numel() + model.head.weight.numel()
    log(f"params {n_params/1e6:.2f} M ({(n_params - n_emb)/1e6:.2f} M without embedding and head); "
        f"trained vocab rows {len(seen)} of {args.vocab_size}")
    log(json.dumps({"args": dsv4.asdict(args)}))

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() == 2 and "embed" not in n and "head." != n[:5] and "hc_" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))

    train = Data(a.corpus, "train", dev)
    test = Data(a.corpus, "test", dev)
    tok = {s: len(train.streams[s]) for s in SOURCES}
    base = {s: tok[s] for s in SOURCES}
    base["wordnet"] = 0.12 * sum(tok.values())
    base["chat"] = 0.04 * sum(tok.values())
    tot = sum(base.values())
    w_pre = {s: base[s] / tot for s in SOURCES}
    w_chat = {s: 0.5 * w_pre[s] / (1 - w_pre["chat"]) for s in SOURCES}
    w_chat["chat"] = 0.5
    log("mixture (pretraining):", {k: round(v, 3) for k, v in w_pre.items()})
    log("mixture (chat stage):", {k: round(v, 3) for k, v in w_chat.items()})
    B, S = (4, 128) if a.small else (a.batch, a.seq)
    egen = torch.Generator().manual_seed(999)
    eval_windows = {s: test.batch(egen, {s: 1.0}, 16 if not a.small else 2, S) for s in SOURCES}

    budget = a.minutes * 60
    t0 = time.time()
    step, hist = 0, []
    last_eval = t0
    tokens = 0
    while True:
        el = time.time() - t0
        frac = el / budget
        if frac >= 1.0 or (a.max_steps and step >= a.max_steps):
            break
        weights = w_chat if frac > 1 - a.chat_frac else w_pre
        x_cpu = train.batch_cpu(gen, weights, B, S)
        x = x_cpu.to(dev, non_blocking=True)
        # from the host copy, before the step: no device-to-host sync on the training path
        w = copy_weights(x_cpu, a.copy_weight).to(dev, non_blocking=True) if a.copy_weight != 1.0 else None
        lr = lr_at(frac, step, a.lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        with dt_ctx():
            logits, mlog, _ = model(x[:, :-1])
            if w is not None:
                ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1),
                                     reduction="none")
                loss_main = (ce * w.reshape(-1)).sum() / w.sum()
            else:
                loss_main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))
            loss_mtp = F.cross_entropy(mlog.reshape(-1, mlog.shape[-1]).float(), x[:, 2:].reshape(-1))
            loss_idx = indexer_kl(model)
            loss = loss_main + 0.3 * loss_mtp + 0.1 * loss_idx
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # aux-loss-free balancing of the score-routed layers
            for blk in list(model.layers) + [m.block for m in model.mtp]:
                if not blk.ffn.gate.hash and blk.ffn.load is not None:
                    ld = blk.ffn.load
                    blk.ffn.gate.bias += 1e-3 * torch.sign(ld.mean() - ld)
        tokens += x[:, 1:].numel()
        step += 1
        if step % 25 == 0 or step == 1:
            rec = {"step": step, "time": round(time.time() - t0, 1), "tokens": tokens, "lr": lr,
                   "loss": loss_main.item(), "mtp_loss": loss_mtp.item(), "indexer_kl": float(loss_idx),
                   "stage": "chat" if weights is w_chat else "pretrain"}
            if time.time() - last_eval > 45 or step == 1:
                last_eval = time.time()
                ev = {s: evaluate(model, w, dt_ctx) for s, w in eval_windows.items()}
                rec["heldout"] = {s: round(v[0], 4) for s, v in ev.items()}
                rec["heldout_mtp_top1"] = {s: round(v[1], 4) for s, v in ev.items()}
            hist.append(rec)
            log(json.dumps(rec))
            with open(os.path.join(a.out, "loss.jsonl"), "w") as f:
                for r in hist:
                    f.write(json.dumps(r) + "\n")
    train_s = time.time() - t0
    log(f"trained {step} steps, {tokens/1e6:.1f} M tokens in {train_s:.0f} s ({tokens/train_s/1e3:.0f} k tok/s)")

    final = {"steps": step, "tokens": tokens, "train_seconds": train_s, "seed": a.seed,
             "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__}
    ev = {s: evaluate(model, w, dt_ctx) for s, w in eval_windows.items()}
    final["heldout_windows_nll"] = {s: v[0] for s, v in ev.items()}
    final["heldout_windows_mtp_top1"] = {s: v[1] for s, v in ev.items()}
    hid = json.load(open(os.path.join(a.corpus, "heldout_ids.json")))["ids"]
    for ctx in (512,):
        ppl, n, cnt, mtp1 = ppl_disjoint(model, hid, ctx, dt_ctx, dev)
        final[f"heldout_txt_ppl_ctx{ctx}_bf16autocast"] = ppl
        final[f"heldout_txt_mtp_top1_ctx{ctx}"] = mtp1
        final["heldout_txt_windows"] = n
    model_f32 = model.float()
    ppl, n, cnt, mtp1 = ppl_disjoint(model_f32, hid, 512, lambda: torch.autocast("cuda", enabled=False)
                                     if cuda else torch.autocast("cpu", enabled=False), dev)
    final["heldout_txt_ppl_ctx512_fp32"] = ppl
    log(json.dumps(final))
    json.dump(final, open(os.path.join(a.out, "final.json"), "w"), indent=1)
    n = export(model, seen, a.out)
    log(f"exported {n} shards; total wall {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()

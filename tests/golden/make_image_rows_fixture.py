#!/usr/bin/env python3
"""Writes the golden fixture for image rows in the language model (issue 24, docs/vision.md "The language
model's side"): a prompt with text, an image's sentinel block and more text, run through a tiny random
sliding-only DeepSeek-V4 model by an independent float64 torch implementation of the reference semantics.

Runs on the CPU with Debian's python3-torch (1.13) and numpy:

    dsmesh make-tiny --vision --vocab 512 --sliding-layers 2 --out /tmp/ir_model      # the weights (seed 0)
    /usr/bin/python3 tests/golden/make_image_rows_fixture.py --model /tmp/ir_model --out tests/golden/image_rows_v4

The weights are not committed: WriteTinyModel writes the same bytes for the same seed and spec, so the C++
test (model:image_rows_test) writes them again and checks their hash against the one recorded here.

What the reference computes, written from the description (not from our C++):
  * input embeddings: embed[token] for text rows; for image rows (every row of the block: alignment pad,
    IMAGE_START, IMAGE / IMAGE_NEWLINE / PAD rows, IMAGE_END) the given vectors instead;
  * attention (sliding layers only, window W): a row at position t outside every span sees t-W+1 .. t; a row
    inside the span [s, e] (IMAGE_START .. IMAGE_END) sees max(0, min(t-W+1, s)) .. e (DeepSeek's
    get_image_visible + get_window_topk_idxs_visible); sinks as usual;
  * routing: scores sqrt(softplus(logits)); hash layer: text rows tid2eid[token], image rows
    top_k(scores + bias_vl); routed layers: top_k(scores + (bias_vl if image else bias)); weights from the
    unbiased scores, normalized, times routed_scaling_factor.
Hyper-connections, norms, RoPE, experts and head as in make_mtp_fixture.py (imported from there).

Checks printed (and asserted to move the logits): causal-only attention in the span, text bias for image
rows, tid2eid for image rows on the hash layer. The MoE top-k boundary gap is recorded in the metadata.

GOLDEN (golden.safetensors):
  tokens       I64 [T]      the prompt (image rows carry arbitrary in-vocabulary ids: nothing reads them)
  image_rows   I64 [K]      token indices of the image rows (ascending)
  embeddings   F32 [K, D]   their given input embeddings (bf16-exact values)
  span         I64 [2]      IMAGE_START and IMAGE_END token indices
  logits       F32 [T, V]   the reference's logits for every row
"""
import argparse
import hashlib
import json
import os
import platform
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mtp_fixture import bf16, expert, hc_post, hc_pre, read_safetensors, rms, rope, write_safetensors  # noqa: E402

PREFIX_TEXT = 6     # text rows before the block
LLM_GRID = (4, 8)   # the image's aligner grid: 4 rows of 8 IMAGE + IMAGE_NEWLINE -> a span longer than the window
SUFFIX_TEXT = 5     # text rows after IMAGE_END


class Cfg:
    def __init__(self, c):
        self.V, self.D, self.L = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"]
        self.H, self.hd, self.rd = c["num_attention_heads"], c["head_dim"], c["qk_rope_head_dim"]
        self.q_lora, self.groups, self.o_lora = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
        self.window = c["sliding_window"]
        self.E, self.topk = c["n_routed_experts"], c["num_experts_per_tok"]
        self.route_scale, self.limit = c["routed_scaling_factor"], c["swiglu_limit"]
        self.hc, self.iters, self.hc_eps = c["hc_mult"], c["hc_sinkhorn_iters"], c["hc_eps"]
        self.eps = c["rms_norm_eps"]
        self.theta = c["rope_theta"]  # sliding layers: plain RoPE (no YaRN without compression)
        self.hash_layers = c["num_hash_layers"]
        assert all(r == 0 for r in c["compress_ratios"]), "the reference has no compressor: --sliding-layers"


def visible_mask(T, window, span):
    """[T, T] bool: query t sees key j (get_image_visible + get_window_topk_idxs_visible on positions)."""
    t = torch.arange(T)[:, None]
    lo = (t - window + 1).clamp(min=0)
    hi = t.clone()
    s, e = span
    inside = (t >= s) & (t <= e)
    lo = torch.where(inside, torch.minimum(t - window + 1, torch.tensor(s)).clamp(min=0), lo)
    hi = torch.where(inside, torch.full_like(hi, e), hi)
    j = torch.arange(T)[None, :]
    return (j >= lo) & (j <= hi)


def attention(x, visible, w, p, cfg):
    T = x.shape[0]
    pos = torch.arange(T)
    q = rms(x @ w[p + "attn.wq_a.weight"].T, w[p + "attn.q_norm.weight"], cfg.eps) @ w[p + "attn.wq_b.weight"].T
    q = q.view(T, cfg.H, cfg.hd)
    q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + cfg.eps)
    q = rope(q, pos, cfg.rd, cfg.theta)
    kv = rope(rms(x @ w[p + "attn.wkv.weight"].T, w[p + "attn.kv_norm.weight"], cfg.eps), pos, cfg.rd, cfg.theta)
    scores = torch.einsum("thd,sd->ths", q, kv) * cfg.hd ** -0.5
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    sink = w[p + "attn.attn_sink"].view(1, cfg.H, 1).expand(T, cfg.H, 1)
    prob = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    o = rope(torch.einsum("ths,sd->thd", prob, kv), pos, cfg.rd, cfg.theta, inverse=True)
    o = o.reshape(T, cfg.groups, -1)
    wo_a = w[p + "attn.wo_a.weight"].view(cfg.groups, cfg.o_lora, -1)
    return torch.einsum("tgd,grd->tgr", o, wo_a).flatten(1) @ w[p + "attn.wo_b.weight"].T


def moe(x, tokens, image, w, p, hash_layer, variant, cfg, stats):
    scores = F.softplus(x @ w[p + "ffn.gate.weight"].T).sqrt()
    bias_vl = w[p + "ffn.gate.bias_vl"]
    if variant == "text_bias_for_images":
        bias_vl = w[p + "ffn.gate.bias"] if not hash_layer else torch.zeros_like(bias_vl)
    vl_idx = (scores + bias_vl).topk(cfg.topk, -1).indices
    if hash_layer:
        idx = w[p + "ffn.gate.tid2eid"][tokens].long()
        if variant != "hash_for_images":
            idx = torch.where(image[:, None], vl_idx, idx)
    else:
        idx = torch.where(image[:, None], vl_idx, (scores + w[p + "ffn.gate.bias"]).topk(cfg.topk, -1).indices)
        biased = scores + torch.where(image[:, None], bias_vl, w[p + "ffn.gate.bias"])
        srt = biased.sort(-1, descending=True).values
        stats["moe_gap"] = min(stats.get("moe_gap", 1e9), float((srt[:, cfg.topk - 1] - srt[:, cfg.topk]).min()))
    if hash_layer:
        biased = scores + bias_vl
        srt = biased[image].sort(-1, descending=True).values
        if len(srt):
            stats["moe_gap"] = min(stats.get("moe_gap", 1e9), float((srt[:, cfg.topk - 1] - srt[:, cfg.topk]).min()))
    weights = scores.gather(1, idx)
    weights = weights / weights.sum(-1, keepdim=True) * cfg.route_scale
    y = torch.zeros_like(x)
    for e in range(cfg.E):
        rows, slot = torch.where(idx == e)
        if len(rows):
            y[rows] += weights[rows, slot, None] * expert(x[rows], w, f"{p}ffn.experts.{e}.", cfg, stats)
    return y + expert(x, w, p + "ffn.shared_experts.", cfg, stats)


def forward(w, cfg, tokens, image, given, span, variant, stats):
    T = tokens.shape[0]
    h = w["embed.weight"][tokens].clone()
    h[image] = given
    x = h.unsqueeze(1).repeat(1, cfg.hc, 1)
    span_for_attn = span if variant != "causal_span" else (T + 1, T + 1)
    visible = visible_mask(T, cfg.window, span_for_attn)
    for layer in range(cfg.L):
        p = f"layers.{layer}."
        res = x
        y, post, comb = hc_pre(x, w[p + "hc_attn_fn"], w[p + "hc_attn_scale"], w[p + "hc_attn_base"], cfg, stats)
        y = attention(rms(y, w[p + "attn_norm.weight"], cfg.eps), visible, w, p, cfg)
        x = hc_post(y, res, post, comb)
        res = x
        y, post, comb = hc_pre(x, w[p + "hc_ffn_fn"], w[p + "hc_ffn_scale"], w[p + "hc_ffn_base"], cfg, stats)
        y = moe(rms(y, w[p + "ffn_norm.weight"], cfg.eps), tokens, image, w, p, layer < cfg.hash_layers, variant,
                cfg, stats)
        x = hc_post(y, res, post, comb)
    xf = x.flatten(1)
    mixes = (xf @ w["hc_head_fn"].T) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + cfg.eps)
    pre = torch.sigmoid(mixes * w["hc_head_scale"] + w["hc_head_base"]) + cfg.hc_eps
    return rms((pre.unsqueeze(-1) * x).sum(1), w["norm.weight"], cfg.eps) @ w["head.weight"].T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="dsmesh make-tiny --vision --vocab 512 --sliding-layers 2")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = Cfg(json.load(f))
    weights_path = os.path.join(a.model, "model.safetensors")
    with open(weights_path, "rb") as f:
        weights_sha = hashlib.sha256(f.read()).hexdigest()
    w = {k: v.to(torch.float64) for k, v in read_safetensors(weights_path).items()}
    w = {k: (v.long() if k.endswith("tid2eid") else v) for k, v in w.items()}

    # The block as ExpandImagePlaceholders lays it out at this start: 3 - start % 4 pads, START, grid rows
    # (IMAGE x llm_w + NEWLINE), END (an even row count of 8+1 needs no trailing pad).
    gen = torch.Generator().manual_seed(a.seed)
    llm_h, llm_w = LLM_GRID
    start = PREFIX_TEXT
    pad = 3 - start % 4
    block = pad + 1 + llm_h * (llm_w + 1) + 1
    T = PREFIX_TEXT + block + SUFFIX_TEXT
    tokens = torch.randint(2, cfg.V, (T,), generator=gen)
    image = torch.zeros(T, dtype=torch.bool)
    image[start:start + block] = True
    span = (start + pad, start + block - 1)
    assert span[1] - span[0] + 1 > cfg.window, "the span must be longer than the window"
    given = bf16(torch.randn(block, cfg.D, generator=gen)).to(torch.float64)

    stats = {}
    logits = forward(w, cfg, tokens, image, given, span, "reference", stats)
    rel = {}
    for variant in ("causal_span", "text_bias_for_images", "hash_for_images"):
        other = forward(w, cfg, tokens, image, given, span, variant, {})
        rel[variant] = float((other - logits).norm() / logits.norm())
        print(f"{variant}: logits move by rel L2 {rel[variant]:.3g}")
        assert rel[variant] > 1e-3, variant
    print(f"moe top-k boundary gap {stats['moe_gap']:.3g}")

    os.makedirs(a.out, exist_ok=True)
    rows = torch.nonzero(image).flatten()
    meta = {"python": platform.python_version(), "torch": torch.__version__, "seed": str(a.seed),
            "model_sha256": weights_sha, "moe_gap": f"{stats['moe_gap']:.4g}",
            "rel_causal_span": f"{rel['causal_span']:.4g}", "rel_text_bias": f"{rel['text_bias_for_images']:.4g}",
            "rel_hash_for_images": f"{rel['hash_for_images']:.4g}"}
    write_safetensors(os.path.join(a.out, "golden.safetensors"), {
        "tokens": ("I64", tokens), "image_rows": ("I64", rows), "embeddings": ("F32", given.float()),
        "span": ("I64", torch.tensor(span)), "logits": ("F32", logits.float())}, meta)
    print(f"wrote {a.out}: T={T}, {len(rows)} image rows, span {span}, model sha256 {weights_sha[:16]}")


if __name__ == "__main__":
    main()

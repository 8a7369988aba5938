#!/usr/bin/python3
"""Vision-tower fixture: a reduced random DeepSeek-V4-Flash-Vision ViT + aligner run by a small torch
reference written from the reference's description (vLLM's vllm/models/deepseek_v4/common/vision.py,
vl_model.py; summarised in docs/vision.md). It shares nothing with our C++.

Runs on the CPU with Debian's python3-torch (1.13); no transformers, no safetensors package:

    /usr/bin/python3 tests/golden/make_vision_fixture.py --out tests/golden/vision_v4

Writes:
  config.json                    tiny_v4's config plus the vision_* keys of the reduced tower (CONFIG below)
  model.safetensors              vision.*, aligner.*, image_* under the checkpoint's names; linears and their
                                 biases BF16, norm weights and sentinel embeddings F32
  model.safetensors.index.json   names model.safetensors as the only shard
  golden.safetensors             patches F32 [sum h*w, 3 p^2] (bf16-valued), grids I64 [images, 2],
                                 vit_out F32 [sum h*w, dim], aligner_out F32 [sum ceil(h/3)*ceil(w/3), hidden]

The reference computes in float64 on the bf16-valued weights and patches; only the RoPE angles follow the
reference's float32 arithmetic (inv_freq and position * inv_freq), as vision.py computes them.
"""

import argparse
import json
import os
import platform
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

VISION = {
    "vision_n_layers": 2,
    "vision_dim": 64,
    "vision_n_heads": 4,
    "vision_inter_dim": 96,
    "vision_patch_size": 4,
    "vision_downsample_ratio": 3,
    "vision_rope_theta": 10000.0,
}
# ViT patch grids (rows, columns) of the images: one that 3 divides neither way, one it divides both ways,
# one smaller than a 3x3 block in height.
GRIDS = [(5, 7), (6, 3), (2, 4)]

DTYPES = {"F32": (np.float32, 4), "I64": (np.int64, 8), "BF16": (np.uint16, 2)}


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def to_bf16(t):
    """Rounds a float tensor to bf16 values; returns (values as float64, raw uint16 bits)."""
    b = t.to(torch.bfloat16)
    bits = b.view(torch.int16).numpy().view(np.uint16).copy()
    return b.to(torch.float64), bits


def draw_weights(cfg, gen):
    dim, inter, hidden = cfg["vision_dim"], cfg["vision_inter_dim"], cfg["hidden_size"]
    p, r = cfg["vision_patch_size"], cfg["vision_downsample_ratio"]
    w, stored = {}, {}

    def linear(name, out_f, in_f, bias):
        val, bits = to_bf16(torch.randn(out_f, in_f, generator=gen) / in_f ** 0.5)
        w[name + ".weight"], stored[name + ".weight"] = val, ("BF16", bits)
        if bias:
            val, bits = to_bf16(torch.randn(out_f, generator=gen) * 0.1)
            w[name + ".bias"], stored[name + ".bias"] = val, ("BF16", bits)

    def f32(name, t):
        w[name], stored[name] = t.to(torch.float64), ("F32", t.to(torch.float32).numpy())

    linear("vision.patch_embed.proj", dim, 3 * p * p, True)
    for i in range(cfg["vision_n_layers"]):
        b = f"vision.blocks.{i}."
        f32(b + "norm1.weight", torch.rand(dim, generator=gen) * 0.6 + 0.7)
        f32(b + "norm2.weight", torch.rand(dim, generator=gen) * 0.6 + 0.7)
        linear(b + "attn.wqkv", 3 * dim, dim, True)
        linear(b + "attn.wo", dim, dim, True)
        linear(b + "mlp.w1", 2 * inter, dim, False)
        linear(b + "mlp.w2", dim, inter, False)
    f32("vision.norm.weight", torch.rand(dim, generator=gen) * 0.6 + 0.7)
    linear("aligner.w1", hidden, dim * r * r, True)
    linear("aligner.w2", hidden, hidden, True)
    for s in ("image_start", "image_pad", "image_newline", "image_end"):
        f32(s, torch.randn(hidden, generator=gen))
    return w, stored


# ---- the reference, from vision.py's description ----

def rms_norm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def rope_cos_sin(n_h, n_w, head_dim, theta):
    rope_dim = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    hpos = torch.arange(n_h).unsqueeze(1).expand(n_h, n_w)
    wpos = torch.arange(n_w).unsqueeze(0).expand(n_h, n_w)
    freqs = torch.stack([hpos, wpos], dim=-1).reshape(-1, 2, 1).float()
    angles = (freqs * inv_freq).flatten(1).to(torch.float64)  # [h*w, rope_dim]: row angles, then column angles
    return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # broadcast over heads


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def vit(patches, n_h, n_w, w, cfg, use_rope=True):
    dim, heads = cfg["vision_dim"], cfg["vision_n_heads"]
    hd = dim // heads
    x = patches.flatten(1) @ w["vision.patch_embed.proj.weight"].T + w["vision.patch_embed.proj.bias"]
    cos, sin = rope_cos_sin(n_h, n_w, hd, cfg["vision_rope_theta"])
    n = x.shape[0]
    for i in range(cfg["vision_n_layers"]):
        b = f"vision.blocks.{i}."
        h = rms_norm(x, w[b + "norm1.weight"])
        qkv = h @ w[b + "attn.wqkv.weight"].T + w[b + "attn.wqkv.bias"]
        q, k, v = (t.reshape(n, heads, hd) for t in qkv.chunk(3, dim=-1))
        if use_rope:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, n, hd]
        p = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5, dim=-1)  # every patch sees every patch
        o = (p @ v).transpose(0, 1).reshape(n, dim)
        x = x + o @ w[b + "attn.wo.weight"].T + w[b + "attn.wo.bias"]
        h = rms_norm(x, w[b + "norm2.weight"])
        gate, up = (h @ w[b + "mlp.w1.weight"].T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ w[b + "mlp.w2.weight"].T
    return rms_norm(x, w["vision.norm.weight"])


def aligner(x, n_h, n_w, w, cfg):
    r = cfg["vision_downsample_ratio"]
    x = x.view(n_h, n_w, -1).permute(2, 0, 1)
    x = F.pad(x, (0, -n_w % r, 0, -n_h % r))
    x = F.unfold(x.unsqueeze(0), r, stride=r).squeeze(0).transpose(0, 1)
    hidden = F.gelu(x @ w["aligner.w1.weight"].T + w["aligner.w1.bias"])
    return hidden @ w["aligner.w2.weight"].T + w["aligner.w2.bias"]


def rel_l2(a, b):
    return float((a - b).norm() / b.norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_v4"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)

    with open(os.path.join(a.tiny, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(VISION)
    w, stored = draw_weights(cfg, gen)
    p = cfg["vision_patch_size"]

    # Patches as the preprocessing makes them: values in [-1, 1] rounded to bf16, [n, 3, p, p].
    patch_vals, vit_outs, outs = [], [], []
    for n_h, n_w in GRIDS:
        pv, _ = to_bf16(torch.rand(n_h * n_w, 3, p, p, generator=gen) * 2 - 1)
        patch_vals.append(pv)
        y = vit(pv, n_h, n_w, w, cfg)
        vit_outs.append(y)
        outs.append(aligner(y, n_h, n_w, w, cfg))
    patches = torch.cat(patch_vals)
    vit_out, aligner_out = torch.cat(vit_outs), torch.cat(outs)

    # Checks: the 2D RoPE and the per-image attention matter (a bug in either would show in the test).
    no_rope = torch.cat([vit(pv, h, wd, w, cfg, use_rope=False) for pv, (h, wd) in zip(patch_vals, GRIDS)])
    print(f"vit output moves by rel L2 {rel_l2(no_rope, vit_out):.3f} without RoPE")
    flat = [(g[0] * g[1], 1) for g in GRIDS]  # rows as a 1 x n grid: the column angles change, the rows' not
    as_rows = torch.cat([vit(pv, 1, n, w, cfg) for pv, (n, _) in zip(patch_vals, flat)])
    print(f"vit output moves by rel L2 {rel_l2(as_rows, vit_out):.3f} when each image is one row of patches")
    joint = vit(patches, 1, patches.shape[0], w, cfg)  # all images in one attention span (1 x n grid)
    print(f"vit output moves by rel L2 {rel_l2(joint, as_rows):.3f} when the images attend to each other")
    print(f"aligner_out rows {aligner_out.shape[0]}, rms {float(aligner_out.square().mean().sqrt()):.3f}")

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(a.out, "model.safetensors"), {k: (d, v) for k, (d, v) in stored.items()})
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(stored)}}, f, indent=1)
        f.write("\n")
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                "seed": str(a.seed), "grids": json.dumps(GRIDS)}
    write_safetensors(os.path.join(a.out, "golden.safetensors"), {
        "patches": ("F32", patches.flatten(1).to(torch.float32).numpy()),
        "grids": ("I64", np.array(GRIDS, dtype=np.int64)),
        "vit_out": ("F32", vit_out.to(torch.float32).numpy()),
        "aligner_out": ("F32", aligner_out.to(torch.float32).numpy()),
    }, versions)
    print("versions:", versions)


if __name__ == "__main__":
    sys.exit(main())

"""A DeepSeek-V4 model in plain PyTorch for training, written from docs/model-v4.md
(mirrored in docs/trained-model.md): 4-stream hyper-connections with Sinkhorn mixing, shared-KV MQA with
sinks, interleaved partial RoPE (YaRN on the compressed layers), output de-rotation, the grouped low-rank
output projection, sliding-window / CSA (ratio 4, overlapping compressor + lightning indexer) / HCA
(ratio 128) attention, sqrt-softplus MoE (hash-routed and score-routed with the aux-free bias) with a
shared expert and clamped SwiGLU, the hyper head, and one MTP block (next-next token).

Parameter names are DeepSeek's checkpoint names (embed.weight, layers.N.attn.wq_a.weight, mtp.0.e_proj.weight,
...), the spelling `dsmesh quantize` and our loader read. Whole-sequence (training) forward only; the
serving-side incremental forward is the C++ one, checked against this on the same weights.
"""
import math
from dataclasses import dataclass, field, asdict
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Args:
    vocab_size: int = 129280
    dim: int = 128
    ratios: List[int] = field(default_factory=lambda: [0, 4, 128, 4, 128, 4])  # main layers
    n_mtp: int = 1
    n_hash_layers: int = 2
    n_heads: int = 4
    head_dim: int = 128
    rope_dim: int = 32
    q_lora_rank: int = 128
    o_groups: int = 2
    o_lora_rank: int = 128
    window: int = 128
    index_n_heads: int = 32
    index_head_dim: int = 64
    index_topk: int = 16
    n_experts: int = 8
    topk: int = 2
    moe_inter: int = 256
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    hc: int = 4
    sinkhorn_iters: int = 20
    eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    yarn_factor: float = 16.0
    yarn_original: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def config_json(self):
        """config.json in DeepSeek's checkpoint spelling (what TinyModelConfig writes, non-transformers)."""
        return {
            "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
            "vocab_size": self.vocab_size, "hidden_size": self.dim, "num_hidden_layers": len(self.ratios),
            "num_attention_heads": self.n_heads, "num_key_value_heads": 1, "head_dim": self.head_dim,
            "q_lora_rank": self.q_lora_rank, "o_groups": self.o_groups, "o_lora_rank": self.o_lora_rank,
            "sliding_window": self.window, "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim, "index_topk": self.index_topk,
            "n_routed_experts": self.n_experts, "num_experts_per_tok": self.topk, "n_shared_experts": 1,
            "moe_intermediate_size": self.moe_inter, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
            "norm_topk_prob": True, "routed_scaling_factor": self.route_scale, "swiglu_limit": self.swiglu_limit,
            "hc_mult": self.hc, "hc_sinkhorn_iters": self.sinkhorn_iters, "hc_eps": self.eps,
            "rms_norm_eps": self.eps, "hidden_act": "silu", "max_position_embeddings": 1048576,
            "rope_theta": self.rope_theta, "compress_rope_theta": self.compress_rope_theta,
            "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "compress_ratios": list(self.ratios) + [0] * self.n_mtp, "num_hash_layers": self.n_hash_layers,
            "qk_rope_head_dim": self.rope_dim,
            "rope_scaling": {"type": "yarn", "factor": self.yarn_factor,
                             "original_max_position_embeddings": self.yarn_original,
                             "beta_fast": self.beta_fast, "beta_slow": self.beta_slow},
            "num_nextn_predict_layers": self.n_mtp,
        }


def rms(x, w, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y * w.float() if w is not None else y


def rope_freqs(a: Args, compressed: bool):
    dim, base = a.rope_dim, (a.compress_rope_theta if compressed else a.rope_theta)
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if compressed and a.yarn_factor > 1:
        def corr(n):
            return dim * math.log(a.yarn_original / (n * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr(a.beta_fast)), 0)
        high = min(math.ceil(corr(a.beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / a.yarn_factor * (1 - smooth) + freqs * smooth
    return freqs


def rope(x, pos, freqs, inverse=False):
    """Interleaved rotation of the last 2*len(freqs) dims of x [..., S, (h,) d] at positions pos [S]."""
    rd = 2 * freqs.numel()
    ang = pos.double()[:, None] * freqs.to(pos.device)[None, :]  # [S, rd/2]
    if inverse:
        ang = -ang
    cos, sin = ang.cos().float(), ang.sin().float()
    while cos.dim() < x.dim() - 1:
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    # x: [..., S, (H,) d]; cos: [S, (1,) rd/2]
    xr = x[..., -rd:].float().reshape(*x.shape[:-1], rd // 2, 2)
    a0, a1 = xr[..., 0], xr[..., 1]
    out = torch.stack([a0 * cos - a1 * sin, a0 * sin + a1 * cos], -1).reshape(*x.shape[:-1], rd)
    return torch.cat([x[..., :-rd].float(), out], -1).to(x.dtype)


def lin(i, o):
    l = nn.Linear(i, o, bias=False)
    nn.init.normal_(l.weight, std=i ** -0.5)
    return l


class Norm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms(x, self.weight, self.eps)


class Compressor(nn.Module):
    def __init__(self, a: Args, ratio, d, freqs):
        super().__init__()
        self.ratio, self.d, self.c = ratio, d, (2 if ratio == 4 else 1)
        self.wkv = lin(a.dim, self.c * d)
        self.wgate = lin(a.dim, self.c * d)
        self.ape = nn.Parameter(torch.zeros(ratio, self.c * d))
        self.norm = Norm(d, a.eps)
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, x):
        """x [B, S, D] -> entries [B, S // ratio, d] (normed, roped at w * ratio)."""
        B, S, _ = x.shape
        r, d, N = self.ratio, self.d, S // self.ratio
        kvp = self.wkv(x[:, : N * r]).float().view(B, N, r, self.c * d)
        sc = self.wgate(x[:, : N * r]).float().view(B, N, r, self.c * d) + self.ape.float()
        if self.c == 1:
            e = (torch.softmax(sc, 2) * kvp).sum(2)
        else:
            # slots: A half (channels [0, d)) of window w-1, B half ([d, 2d)) of window w
            kA, sA = kvp[..., :d], sc[..., :d]
            kB, sB = kvp[..., d:], sc[..., d:]
            kA = torch.cat([torch.zeros_like(kA[:, :1]), kA[:, :-1]], 1)
            sA = torch.cat([torch.full_like(sA[:, :1], float("-inf")), sA[:, :-1]], 1)
            k8, s8 = torch.cat([kA, kB], 2), torch.cat([sA, sB], 2)
            e = (torch.softmax(s8, 2) * k8).sum(2)
        e = self.norm(e)
        pos = torch.arange(N, device=x.device) * r
        return rope(e, pos, self.freqs)


class Indexer(nn.Module):
    def __init__(self, a: Args, freqs):
        super().__init__()
        self.a = a
        self.wq_b = lin(a.q_lora_rank, a.index_n_heads * a.index_head_dim)
        self.weights_proj = lin(a.dim, a.index_n_heads)
        self.compressor = Compressor(a, 4, a.index_head_dim, freqs)
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, x, qr, pos):
        """Scores [B, S, N] (masked to -inf where not yet available)."""
        a = self.a
        B, S, _ = x.shape
        k = self.compressor(x)  # [B, N, hd_i]
        q = self.wq_b(qr).view(B, S, a.index_n_heads, a.index_head_dim)
        q = rope(q, pos, self.freqs)
        w = self.weights_proj(x).float() * (a.index_head_dim ** -0.5) * (a.index_n_heads ** -0.5)
        s = torch.einsum("bshd,bnd->bshn", q.float(), k.float()).relu()
        score = torch.einsum("bshn,bsh->bsn", s, w)
        N = k.shape[1]
        valid = torch.arange(N, device=x.device)[None, :] < ((pos + 1) // 4)[:, None]  # [S, N]
        return score.masked_fill(~valid, float("-inf")), valid


class Attention(nn.Module):
    def __init__(self, a: Args, ratio):
        super().__init__()
        self.a, self.ratio = a, ratio
        H, hd = a.n_heads, a.head_dim
        self.wq_a = lin(a.dim, a.q_lora_rank)
        self.q_norm = Norm(a.q_lora_rank, a.eps)
        self.wq_b = lin(a.q_lora_rank, H * hd)
        self.wkv = lin(a.dim, hd)
        self.kv_norm = Norm(hd, a.eps)
        self.wo_a = lin(H * hd // a.o_groups, a.o_groups * a.o_lora_rank)
        self.wo_b = lin(a.o_groups * a.o_lora_rank, a.dim)
        self.attn_sink = nn.Parameter(torch.zeros(H))
        freqs = rope_freqs(a, compressed=ratio > 0)
        self.register_buffer("freqs", freqs, persistent=False)
        if ratio > 0:
            self.compressor = Compressor(a, ratio, hd, freqs)
        if ratio == 4:
            self.indexer = Indexer(a, freqs)
        self.aux = {}

    def forward(self, x):
        a = self.a
        B, S, _ = x.shape
        H, hd = a.n_heads, a.head_dim
        pos = torch.arange(S, device=x.device)
        qr = self.q_norm(self.wq_a(x))
        q = self.wq_b(qr.to(x.dtype)).view(B, S, H, hd)
        q = rms(q, None, a.eps)
        q = rope(q, pos, self.freqs)
        kv = rope(self.kv_norm(self.wkv(x)), pos, self.freqs)  # [B, S, hd]
        scale = hd ** -0.5
        dt = x.dtype if x.dtype != torch.float32 else torch.float32
        s_win = torch.einsum("bshd,btd->bhst", q.to(dt), kv.to(dt)).float() * scale
        t = pos[None, :]
        s_ = pos[:, None]
        win = (t <= s_) & (t > s_ - a.window)
        s_win = s_win.masked_fill(~win, float("-inf"))
        keys, scores = [kv], [s_win]
        if self.ratio > 0:
            ent = self.compressor(x)  # [B, N, hd]
            N = ent.shape[1]
            s_c = torch.einsum("bshd,bnd->bhsn", q.to(dt), ent.to(dt)).float() * scale
            avail = torch.arange(N, device=x.device)[None, :] < ((pos + 1) // self.ratio)[:, None]
            mask = avail[None].expand(B, S, N)
            if self.ratio == 4:
                iscore, valid = self.indexer(x.detach(), qr.detach(), pos)
                k = min(a.index_topk, N)
                if k > 0 and N > 0:
                    top = iscore.topk(k, dim=-1).indices
                    sel = torch.zeros(B, S, N, dtype=torch.bool, device=x.device).scatter_(-1, top, True)
                    mask = mask & sel
                self.aux["indexer_score"] = iscore
                self.aux["indexer_valid"] = valid
                # distillation target: the heads' mean dense attention over all available entries
                dense = s_c.detach().masked_fill(~avail[None, None], float("-inf")).softmax(-1)
                self.aux["attn_comp"] = torch.nan_to_num(dense, nan=0.0).mean(1)
            s_c = s_c.masked_fill(~mask[:, None], float("-inf"))
            keys.append(ent)
            scores.append(s_c)
        s_all = torch.cat(scores, -1)  # [B, H, S, S(+N)]
        sink = self.attn_sink.float().view(1, H, 1, 1).expand(B, H, S, 1)
        p = torch.softmax(torch.cat([s_all, sink], -1), -1)[..., :-1]
        kall = torch.cat(keys, 1).to(dt)  # [B, S(+N), hd]
        o = torch.einsum("bhst,btd->bshd", p.to(dt), kall)
        o = rope(o, pos, self.freqs, inverse=True)
        G = a.o_groups
        og = o.reshape(B, S, G, H * hd // G)
        wa = self.wo_a.weight.view(G, a.o_lora_rank, H * hd // G)
        r = torch.einsum("bsgi,goi->bsgo", og.to(dt), wa.to(dt)).reshape(B, S, G * a.o_lora_rank)
        return self.wo_b(r)


class Expert(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        self.w1, self.w3 = lin(a.dim, a.moe_inter), lin(a.dim, a.moe_inter)
        self.w2 = lin(a.moe_inter, a.dim)
        self.lim = a.swiglu_limit

    def forward(self, x):
        g, u = self.w1(x).float(), self.w3(x).float()
        u = u.clamp(-self.lim, self.lim)
        g = g.clamp(max=self.lim)
        return self.w2((F.silu(g) * u).to(x.dtype))


class Gate(nn.Module):
    def __init__(self, a: Args, hash_layer):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(a.n_experts, a.dim) * a.dim ** -0.5)
        self.hash = hash_layer
        if hash_layer:
            g = torch.Generator().manual_seed(1234)
            t = torch.stack([torch.randperm(a.n_experts, generator=g)[: a.topk] for _ in range(a.vocab_size)])
            self.register_buffer("tid2eid", t.to(torch.int32))
        else:
            self.register_buffer("bias", torch.zeros(a.n_experts))


class MoE(nn.Module):
    def __init__(self, a: Args, hash_layer):
        super().__init__()
        self.a = a
        self.gate = Gate(a, hash_layer)
        self.experts = nn.ModuleList([Expert(a) for _ in range(a.n_experts)])
        self.shared_experts = Expert(a)
        self.load = None

    def forward(self, x, ids):
        a = self.a
        B, S, D = x.shape
        xf = x.reshape(-1, D)
        scores = torch.sqrt(F.softplus(xf.float() @ self.gate.weight.float().t()))  # [T, E]
        if self.gate.hash:
            idx = self.gate.tid2eid[ids.reshape(-1)].long()
        else:
            idx = (scores + self.gate.bias.float()).topk(a.topk, -1).indices
        w = scores.gather(-1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * a.route_scale
        dense_w = torch.zeros_like(scores).scatter_add_(-1, idx, w)  # [T, E]
        self.load = torch.zeros(a.n_experts, device=x.device).scatter_add_(
            0, idx.reshape(-1), torch.ones(idx.numel(), device=x.device)).detach()
        out = self.shared_experts(xf).float()
        for e, ex in enumerate(self.experts):
            rows = (idx == e).any(-1).nonzero().squeeze(-1)
            if rows.numel() == 0:
                continue
            out = out.index_add(0, rows, ex(xf[rows]).float() * dense_w[rows, e : e + 1])
        return out.view(B, S, D).to(x.dtype)


class HcSite(nn.Module):
    def __init__(self, a: Args, rows):
        super().__init__()
        self.a = a
        self.fn = nn.Parameter(torch.randn(rows, a.hc * a.dim) * (a.hc * a.dim) ** -0.5 * 0.1)
        self.base = nn.Parameter(torch.zeros(rows))
        self.scale = nn.Parameter(torch.ones(3 if rows > a.hc else 1))

    def mixes(self, X):
        a = self.a
        Xf = X.float().flatten(-2)
        r = torch.rsqrt(Xf.pow(2).mean(-1, keepdim=True) + a.eps)
        return (Xf @ self.fn.float().t()) * r

    def pre(self, X):
        a, hc = self.a, self.a.hc
        m = self.mixes(X)
        pre = torch.sigmoid(m[..., :hc] * self.scale[0] + self.base[:hc]) + a.eps
        post = 2 * torch.sigmoid(m[..., hc: 2 * hc] * self.scale[1] + self.base[hc: 2 * hc])
        comb = (m[..., 2 * hc:] * self.scale[2] + self.base[2 * hc:]).view(*m.shape[:-1], hc, hc)
        comb = torch.softmax(comb, -1) + a.eps
        comb = comb / (comb.sum(-2, keepdim=True) + a.eps)
        for _ in range(a.sinkhorn_iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + a.eps)
            comb = comb / (comb.sum(-2, keepdim=True) + a.eps)
        y = (pre.unsqueeze(-1) * X.float()).sum(-2)
        return y, post, comb

    def head(self, X):
        a = self.a
        m = self.mixes(X)
        pre = torch.sigmoid(m * self.scale[0] + self.base) + a.eps
        return (pre.unsqueeze(-1) * X.float()).sum(-2)


def hc_post(F_out, X, post, comb):
    return post.unsqueeze(-1) * F_out.float().unsqueeze(-2) + torch.einsum("...ij,...id->...jd", comb, X.float())


class Block(nn.Module):
    def __init__(self, a: Args, ratio, hash_layer):
        super().__init__()
        rows = (2 + a.hc) * a.hc
        self.attn_norm, self.ffn_norm = Norm(a.dim, a.eps), Norm(a.dim, a.eps)
        self.hc_attn, self.hc_ffn = HcSite(a, rows), HcSite(a, rows)
        self.attn = Attention(a, ratio)
        self.ffn = MoE(a, hash_layer)

    def forward(self, X, ids, dt):
        y, post, comb = self.hc_attn.pre(X)
        X = hc_post(self.attn(self.attn_norm(y).to(dt)), X, post, comb)
        y, post, comb = self.hc_ffn.pre(X)
        X = hc_post(self.ffn(self.ffn_norm(y).to(dt), ids), X, post, comb)
        return X


class MTP(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        self.e_proj, self.h_proj = lin(a.dim, a.dim), lin(a.dim, a.dim)
        self.enorm, self.hnorm, self.norm = Norm(a.dim, a.eps), Norm(a.dim, a.eps), Norm(a.dim, a.eps)
        self.hc_head = HcSite(a, a.hc)
        self.block = Block(a, 0, False)


class Transformer(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        self.a = a
        self.embed = nn.Embedding(a.vocab_size, a.dim)
        nn.init.normal_(self.embed.weight, std=1.0)
        self.layers = nn.ModuleList([Block(a, r, i < a.n_hash_layers) for i, r in enumerate(a.ratios)])
        self.norm = Norm(a.dim, a.eps)
        self.hc_head = HcSite(a, a.hc)
        self.head = lin(a.dim, a.vocab_size)
        self.mtp = nn.ModuleList([MTP(a) for _ in range(a.n_mtp)])

    def forward(self, ids, dt=torch.float32, mtp=True):
        """ids [B, S] -> logits [B, S, V] (fp32 head), MTP logits [B, S-1, V] (row t predicts t+2) or None."""
        a = self.a
        h = self.embed(ids).to(dt)
        X = h.unsqueeze(-2).expand(*h.shape[:-1], a.hc, a.dim).contiguous()
        for layer in self.layers:
            X = layer(X, ids, dt)
        logits = self.head(self.norm(self.hc_head.head(X)).to(dt)).float()
        mlog = None
        if mtp and self.a.n_mtp:
            mlog = self.mtp_logits(X, ids, dt)
        return logits, mlog, X

    def mtp_logits(self, X, ids, dt):
        """MTP block on rows (X_t, token t+1) for t = 0 .. S-2; the embedding is zeroed at position 0."""
        m = self.mtp[0]
        e = self.embed(ids[:, 1:]).float()
        e = torch.cat([torch.zeros_like(e[:, :1]), e[:, 1:]], 1)
        e = m.e_proj(m.enorm(e).to(dt))
        Xt = X[:, :-1]
        hp = m.h_proj(m.hnorm(Xt).to(dt))
        X0 = hp.float() + e.float().unsqueeze(-2)
        X1 = m.block(X0, ids[:, 1:], dt)
        return self.head(m.norm(m.hc_head.head(X1)).to(dt)).float()


def state_dict_ds(model: Transformer):
    """The checkpoint tensors in DeepSeek names (hc_* as hc_attn_fn/..., tid2eid int32, bias fp32)."""
    out = {}
    for k, v in model.state_dict().items():
        n = k
        n = n.replace("mtp.0.block.", "mtp.0.")
        for site in ("hc_attn", "hc_ffn", "hc_head"):
            n = n.replace(f"{site}.fn", f"{site}_fn").replace(f"{site}.base", f"{site}_base").replace(
                f"{site}.scale", f"{site}_scale")
        n = n.replace("ffn.gate.tid2eid", "ffn.gate.tid2eid")
        out[n] = v
    return out


def load_ds(model: Transformer, tensors):
    """Inverse of state_dict_ds."""
    inv = {}
    for k in model.state_dict().keys():
        inv[state_dict_ds_name(k)] = k
    sd = {}
    for n, v in tensors.items():
        if n not in inv:
            raise KeyError(f"unexpected tensor {n}")
        sd[inv[n]] = v
    missing = set(model.state_dict().keys()) - set(sd)
    model.load_state_dict(sd, strict=False)
    return missing


def state_dict_ds_name(k):
    n = k.replace("mtp.0.block.", "mtp.0.")
    for site in ("hc_attn", "hc_ffn", "hc_head"):
        n = n.replace(f"{site}.fn", f"{site}_fn").replace(f"{site}.base", f"{site}_base").replace(
            f"{site}.scale", f"{site}_scale")
    return n


FP32_NAMES = ("hc_", "attn_sink", ".ape", "gate.bias")


def export_tensors(model: Transformer, embed_dtype=torch.bfloat16):
    """Tensors as the checkpoint stores them: bf16 except fp32 hc/sinks/ape/bias and int32 tid2eid."""
    out = {}
    for n, v in state_dict_ds(model).items():
        v = v.detach().cpu()
        if not v.is_floating_point():
            out[n] = v.to(torch.int32).contiguous()
        elif any(s in n for s in FP32_NAMES):
            out[n] = v.float().contiguous()
        elif n == "embed.weight":
            out[n] = v.to(embed_dtype).contiguous()
        else:
            out[n] = v.to(torch.bfloat16).contiguous()
    return out

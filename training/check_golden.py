#!/usr/bin/env python3
"""Checks training/dsv4.py against transformers' numbers: loads tests/golden/tiny_v4 (a random V4 model in
transformers' names, with the logits transformers computed in fp32) into our training model and compares.

    python3 training/check_golden.py [--dir tests/golden/tiny_v4]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import dsv4  # noqa: E402
import st  # noqa: E402

RENAMES = [
    ("attn.indexer.compressor.wkv.", "self_attn.compressor.indexer.kv_proj."),
    ("attn.indexer.compressor.wgate.", "self_attn.compressor.indexer.gate_proj."),
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.norm.", "self_attn.compressor.indexer.kv_norm."),
    ("attn.indexer.wq_b.", "self_attn.compressor.indexer.q_b_proj."),
    ("attn.indexer.weights_proj.", "self_attn.compressor.indexer.scorer.weights_proj."),
    ("attn.compressor.wkv.", "self_attn.compressor.kv_proj."),
    ("attn.compressor.wgate.", "self_attn.compressor.gate_proj."),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.norm.", "self_attn.compressor.kv_norm."),
    ("attn.wq_a.", "self_attn.q_a_proj."), ("attn.q_norm.", "self_attn.q_a_norm."),
    ("attn.wq_b.", "self_attn.q_b_proj."), ("attn.wkv.", "self_attn.kv_proj."),
    ("attn.kv_norm.", "self_attn.kv_norm."), ("attn.wo_a.", "self_attn.o_a_proj."),
    ("attn.wo_b.", "self_attn.o_b_proj."), ("attn.attn_sink", "self_attn.sinks"),
    ("attn_norm.", "input_layernorm."), ("ffn_norm.", "post_attention_layernorm."),
    ("hc_attn_fn", "attn_hc.fn"), ("hc_attn_base", "attn_hc.base"), ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"), ("hc_ffn_base", "ffn_hc.base"), ("hc_ffn_scale", "ffn_hc.scale"),
    ("ffn.gate.weight", "mlp.gate.weight"), ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn.gate.tid2eid", "mlp.gate.tid2eid"),
    ("ffn.shared_experts.w1.", "mlp.shared_experts.gate_proj."),
    ("ffn.shared_experts.w3.", "mlp.shared_experts.up_proj."),
    ("ffn.shared_experts.w2.", "mlp.shared_experts.down_proj."),
]
TOP = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight", "model.norm.weight": "norm.weight",
       "model.hc_head.hc_fn": "hc_head_fn", "model.hc_head.hc_base": "hc_head_base",
       "model.hc_head.hc_scale": "hc_head_scale"}


def hf_to_ds(tensors):
    out = {}
    for n, v in tensors.items():
        if n in TOP:
            out[TOP[n]] = v
            continue
        assert n.startswith("model.layers."), n
        rest = n[len("model.layers."):]
        layer, rest = rest.split(".", 1)
        p = f"layers.{layer}."
        if rest == "mlp.experts.gate_up_proj":
            I = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[p + f"ffn.experts.{e}.w1.weight"] = v[e, :I]
                out[p + f"ffn.experts.{e}.w3.weight"] = v[e, I:]
            continue
        if rest == "mlp.experts.down_proj":
            for e in range(v.shape[0]):
                out[p + f"ffn.experts.{e}.w2.weight"] = v[e]
            continue
        for ds, hf in RENAMES:
            if rest.startswith(hf):
                out[p + ds + rest[len(hf):]] = v
                break
        else:
            raise KeyError(n)
    return out


def args_from_hf(c):
    kinds = {"sliding_attention": 0, "compressed_sparse_attention": c["compress_rates"]["compressed_sparse_attention"],
             "heavily_compressed_attention": c["compress_rates"]["heavily_compressed_attention"]}
    y = c["rope_parameters"]["compress"]
    return dsv4.Args(vocab_size=c["vocab_size"], dim=c["hidden_size"], ratios=[kinds[t] for t in c["layer_types"]],
                     n_mtp=0, n_hash_layers=c["mlp_layer_types"].count("hash_moe"), n_heads=c["num_attention_heads"],
                     head_dim=c["head_dim"], rope_dim=c["qk_rope_head_dim"], q_lora_rank=c["q_lora_rank"],
                     o_groups=c["o_groups"], o_lora_rank=c["o_lora_rank"], window=c["sliding_window"],
                     index_n_heads=c["index_n_heads"], index_head_dim=c["index_head_dim"], index_topk=c["index_topk"],
                     n_experts=c["n_routed_experts"], topk=c["num_experts_per_tok"],
                     moe_inter=c["moe_intermediate_size"], route_scale=c["routed_scaling_factor"],
                     swiglu_limit=c["swiglu_limit"], yarn_factor=y["factor"],
                     yarn_original=y["original_max_position_embeddings"], beta_fast=y["beta_fast"],
                     beta_slow=y["beta_slow"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="tests/golden/tiny_v4")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    args = args_from_hf(cfg)
    model = dsv4.Transformer(args).float().eval()
    missing = dsv4.load_ds(model, {k: v.float() if v.is_floating_point() else v
                                   for k, v in hf_to_ds(st.load(os.path.join(a.dir, "model.safetensors"))).items()})
    print("missing:", sorted(missing))
    g = st.load(os.path.join(a.dir, "golden.safetensors"))
    with torch.no_grad():
        logits, _, X = model(g["input_ids"][None], mtp=False)
        seq = torch.cat([g["input_ids"], g["greedy_tokens"]])[None]
        la, _, _ = model(seq, mtp=False)
    ref = g["logits"]
    d = (logits[0] - ref).norm() / ref.norm()
    d2 = (la[0] - g["logits_all"]).norm() / g["logits_all"].norm()
    print(f"prompt logits rel L2 {d:.3e} max abs {(logits[0] - ref).abs().max():.3e}; "
          f"prompt+greedy rel L2 {d2:.3e}")
    L = len(args.ratios)
    print(f"final layer hidden rel L2 {((X[0] - g[f'hidden_l{L-1}']).norm() / g[f'hidden_l{L-1}'].norm()):.3e}")
    ok = d < 1e-4 and d2 < 1e-4
    print("GOLDEN", "OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

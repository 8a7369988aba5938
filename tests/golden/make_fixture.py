#!/usr/bin/env python3
"""Writes the golden fixture for the DeepSeek-V4 forward pass: a tiny random V4 model run by transformers.

Runs where torch and a transformers with DeepseekV4ForCausalLM (5.17+) are installed (the GPU machine; it
runs on CPU there, no GPU needed):

    python3 tests/golden/make_fixture.py --out OUTDIR [--seed 0]

OUTDIR receives
  config.json                    exactly as transformers' save_pretrained writes it (transformers spelling)
  model.safetensors              transformers tensor names; bf16-rounded values, stored BF16 except the
                                 parameters real checkpoints keep in fp32 (hc_*, sinks, position_bias,
                                 e_score_correction_bias: stored F32) and tid2eid (I64)
  model.safetensors.index.json   names model.safetensors as the only shard, so a directory reader that
                                 honours the index ignores golden.safetensors beside it
  golden.safetensors             what transformers computed in fp32 on those weights (see GOLDEN below)

Why the odd choices:
  * Everything transformers initialises to 0 or 1 (sinks, hc base/scale, compressor position_bias,
    e_score_correction_bias, tid2eid, norm weights) is randomised: zeros hide whole code paths.
  * tid2eid rows hold distinct experts (HF index_add_ would count a repeated expert twice).
  * index_n_heads >= 32 so indexer scores are not exactly 0 (ReLU) and top-k has no ties.
  * The model and prompt are re-drawn (seed, seed+1, ...) until every discrete decision has a clear
    margin: greedy top-1 vs top-2 logit, MoE top-k boundary, indexer top-k boundary. An fp32
    re-implementation then cannot flip a choice by rounding alone.
  * swiglu_limit is small enough that the clamps actually fire on these activations.
  * Greedy decoding reruns the full forward without a cache at every step (no reliance on HF's cache).
"""
import argparse
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------------------
# The tiny configuration. Layer kinds: SWA, CSA (ratio 4, overlapping, indexer), HCA (ratio 8), CSA, HCA.
# Two hash-routed MoE layers, then three regular top-k MoE layers.
VOCAB = 512
HIDDEN = 128
LAYER_TYPES = [
    "sliding_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
]
MLP_LAYER_TYPES = ["hash_moe", "hash_moe", "moe", "moe", "moe"]
CSA_RATIO = 4
HCA_RATIO = 8
SLIDING_WINDOW = 12  # not a multiple of either ratio, so window and compression boundaries differ
HEAD_DIM = 64
ROPE_DIM = 16
INDEX_TOPK = 6

CONFIG_KWARGS = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=len(LAYER_TYPES),
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=HEAD_DIM,
    partial_rotary_factor=ROPE_DIM / HEAD_DIM,
    q_lora_rank=64,
    o_groups=2,
    o_lora_rank=32,
    sliding_window=SLIDING_WINDOW,
    layer_types=LAYER_TYPES,
    compress_rates={"compressed_sparse_attention": CSA_RATIO, "heavily_compressed_attention": HCA_RATIO},
    mlp_layer_types=MLP_LAYER_TYPES,
    index_n_heads=32,
    index_head_dim=32,
    index_topk=INDEX_TOPK,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_shared_experts=1,
    moe_intermediate_size=32,
    scoring_func="sqrtsoftplus",
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    swiglu_limit=1.0,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    # YaRN for the compressed layers. original_max_position_embeddings is small so that the YaRN ramp
    # falls inside the 8 rotary frequency pairs and a missing/incorrect YaRN changes the logits.
    rope_parameters={
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 512,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
    max_position_embeddings=512 * 16,
    num_nextn_predict_layers=0,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
)

# The same model in the checkpoint's legacy spelling, used only if this transformers rejects the above.
LEGACY_KWARGS_OVERRIDE = dict(
    compress_ratios=[{"sliding_attention": 0, "compressed_sparse_attention": CSA_RATIO,
                      "heavily_compressed_attention": HCA_RATIO}[t] for t in LAYER_TYPES],
    compress_rate_csa=CSA_RATIO,
    compress_rate_hca=HCA_RATIO,
    num_hash_layers=MLP_LAYER_TYPES.count("hash_moe"),
    qk_rope_head_dim=ROPE_DIM,
)

# Parameters that real V4 checkpoints keep in fp32; everything else float is stored as bf16.
FP32_STORED = re.compile(r"(attn_hc|ffn_hc|hc_head)\.|sinks$|position_bias$|e_score_correction_bias$")

# Margins required before a draw is accepted (see the module docstring).
MIN_GREEDY_MARGIN = 5e-3
MIN_MOE_GAP = 5e-5
MIN_INDEXER_GAP = 1e-4


def log(*args):
    print(*args, flush=True)


def make_config():
    from transformers import DeepseekV4Config

    try:
        return DeepseekV4Config(**CONFIG_KWARGS), "transformers spelling"
    except Exception as e:  # noqa: BLE001 - report and fall back to the legacy spelling
        log(f"WARNING: DeepseekV4Config rejected the transformers spelling: {type(e).__name__}: {e}")
        kwargs = {k: v for k, v in CONFIG_KWARGS.items()
                  if k not in ("layer_types", "compress_rates", "mlp_layer_types", "partial_rotary_factor")}
        kwargs.update(LEGACY_KWARGS_OVERRIDE)
        return DeepseekV4Config(**kwargs), "legacy spelling"


def randomize(model, generator):
    """Draws every parameter and buffer of the state dict; returns {name: rule} for the log."""
    cfg = model.config
    rules = {}
    state = model.state_dict()
    for name, t in state.items():
        def normal(std, mean=0.0):
            t.copy_(torch.randn(t.shape, generator=generator) * std + mean)

        def uniform(lo, hi):
            t.copy_(torch.rand(t.shape, generator=generator) * (hi - lo) + lo)

        last = name.split(".")[-1]
        parent = name.split(".")[-2] if "." in name else ""
        if last == "tid2eid":
            rows = [torch.randperm(cfg.n_routed_experts, generator=generator)[: cfg.num_experts_per_tok]
                    for _ in range(t.shape[0])]
            t.copy_(torch.stack(rows).to(t.dtype))
            rule = "randperm rows"
        elif last == "e_score_correction_bias":
            normal(0.25); rule = "N(0,0.25)"
        elif last == "sinks":
            normal(1.0); rule = "N(0,1)"
        elif last == "position_bias":
            normal(0.5); rule = "N(0,0.5)"
        elif (parent in ("attn_hc", "ffn_hc") and last == "fn") or last == "hc_fn":
            normal(1.0 / math.sqrt(t.shape[1])); rule = "N(0,1/sqrt(in))"
        elif (parent in ("attn_hc", "ffn_hc") and last == "base") or last == "hc_base":
            normal(0.5); rule = "N(0,0.5)"
        elif (parent in ("attn_hc", "ffn_hc") and last == "scale") or last == "hc_scale":
            uniform(0.5, 1.5); rule = "U(0.5,1.5)"
        elif last == "weight" and "norm" in parent and t.dim() == 1:
            uniform(0.7, 1.3); rule = "U(0.7,1.3)"
        elif name.endswith("embed_tokens.weight"):
            normal(1.0); rule = "N(0,1)"
        elif last == "gate_up_proj" and t.dim() == 3:
            normal(1.0 / math.sqrt(t.shape[2])); rule = "N(0,1/sqrt(in))"
        elif last == "down_proj" and t.dim() == 3:
            normal(1.0 / math.sqrt(t.shape[2])); rule = "N(0,1/sqrt(in))"
        elif last == "weight" and t.dim() == 2:
            normal(1.0 / math.sqrt(t.shape[1])); rule = "N(0,1/sqrt(in))"
        else:
            log(f"WARNING: no randomisation rule for {name} {tuple(t.shape)} {t.dtype}; using N(0,0.5)")
            normal(0.5); rule = "N(0,0.5) (fallback)"
        if t.is_floating_point():
            t.copy_(t.to(torch.bfloat16).to(t.dtype))  # the fixture's weights are exactly bf16 values
        rules[name] = rule
    return rules


class Probe:
    """Forward hooks that record per-layer activations and the margins of every discrete choice."""

    def __init__(self, model):
        self.model = model
        self.handles = []
        self.records = {}
        self.moe_gap = math.inf
        self.indexer_gap = math.inf
        self.record = False

    def __enter__(self):
        layers = self.model.model.layers
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_hook(self._save(f"hidden_l{i}", lambda o: o)))
            self.handles.append(layer.self_attn.register_forward_hook(self._save(f"attn_out_l{i}", lambda o: o[0])))
            self.handles.append(layer.mlp.register_forward_hook(self._save(f"moe_out_l{i}", lambda o: o)))
            self.handles.append(layer.mlp.gate.register_forward_hook(self._gate_hook(i)))
            comp = getattr(layer.self_attn, "compressor", None)
            if comp is not None:
                self.handles.append(comp.register_forward_hook(self._save(f"compressed_kv_l{i}", lambda o: o[0][0, 0])))
                indexer = getattr(comp, "indexer", None)
                if indexer is not None:
                    self.handles.append(indexer.register_forward_hook(self._save(f"indexer_topk_l{i}", lambda o: o[0])))
                    self.handles.append(indexer.scorer.register_forward_hook(self._scorer_hook(indexer)))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()

    def _save(self, key, pick):
        def hook(module, inputs, output):
            if self.record:
                value = pick(output)
                if value.dim() >= 1 and value.shape[0] == 1 and key.startswith(("hidden", "attn_out", "moe_out")):
                    value = value[0]
                self.records[key] = value.detach().clone()
        return hook

    def _gate_hook(self, i):
        def hook(module, inputs, output):
            logits, weights, indices = output
            if self.record:
                self.records[f"moe_experts_l{i}"] = indices.detach().clone()
                self.records[f"moe_weights_l{i}"] = weights.detach().float().clone()
            bias = getattr(module, "e_score_correction_bias", None)
            if bias is None:  # hash routing: no top-k
                return
            scores = torch.sqrt(F.softplus(logits.float())) + bias.float()
            top = scores.sort(dim=-1, descending=True).values
            k = module.top_k
            self.moe_gap = min(self.moe_gap, float((top[:, k - 1] - top[:, k]).min()))
        return hook

    def _scorer_hook(self, indexer):
        def hook(module, inputs, output):
            scores = output[0].float()  # [S, T]
            seq, entries = scores.shape
            if seq == 0 or entries == 0:
                return
            # In these full (uncached) forwards query s sits at position s.
            for s in range(seq):
                valid = (s + 1) // indexer.compress_rate
                if valid > indexer.index_topk:
                    top = scores[s, :valid].sort(descending=True).values
                    k = indexer.index_topk
                    self.indexer_gap = min(self.indexer_gap, float(top[k - 1] - top[k]))
        return hook


def forward_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids.unsqueeze(0), use_cache=False).logits[0].float()


def greedy(model, prompt, new_tokens):
    """Greedy continuation by rerunning the full forward (no cache) each step; returns tokens, min margin."""
    seq = prompt.clone()
    out, margin = [], math.inf
    for _ in range(new_tokens):
        last = forward_logits(model, seq)[-1]
        top2 = last.topk(2).values
        margin = min(margin, float(top2[0] - top2[1]))
        token = int(last.argmax())
        out.append(token)
        seq = torch.cat([seq, torch.tensor([token], dtype=seq.dtype)])
    return torch.tensor(out, dtype=torch.long), margin


def set_eager_experts(model):
    for how in ("set_experts_implementation",):
        fn = getattr(model, how, None)
        if fn is not None:
            try:
                fn("eager")
                return f"{how}('eager')"
            except Exception as e:  # noqa: BLE001
                log(f"note: {how}('eager') failed: {e}")
    if hasattr(model.config, "_experts_implementation"):
        model.config._experts_implementation = "eager"
        return "config._experts_implementation = 'eager'"
    return "default"


def build(seed, prompt_len):
    from transformers import DeepseekV4ForCausalLM

    config, spelling = make_config()
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(config).float().eval()
    experts_impl = set_eager_experts(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rules = randomize(model, generator)
    prompt = torch.randint(2, VOCAB, (prompt_len,), generator=generator, dtype=torch.long)
    return model, prompt, rules, spelling, experts_impl


def cached_decode_check(model, prompt, greedy_tokens, logits_all):
    """HF's own cached path: prefill the prompt, then decode the greedy tokens one at a time."""
    with torch.no_grad():
        out = model(input_ids=prompt.unsqueeze(0), use_cache=True)
        diffs = [float((out.logits[0].float() - logits_all[: len(prompt)]).abs().max())]
        past = out.past_key_values
        for i, tok in enumerate(greedy_tokens[:-1].tolist()):
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            diffs.append(float((out.logits[0, -1].float() - logits_all[len(prompt) + i]).abs().max()))
    return max(diffs)


def write_safetensors(path, tensors, metadata):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=metadata)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--seed", type=int, default=0, help="first seed tried for weights and prompt")
    parser.add_argument("--prompt-len", type=int, default=70)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--max-draws", type=int, default=30)
    args = parser.parse_args()

    import safetensors
    import transformers

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    versions = (f"python {platform.python_version()}, torch {torch.__version__}, "
                f"transformers {transformers.__version__}, safetensors {safetensors.__version__}")
    log("versions:", versions)

    # Draw until every discrete choice has a clear margin.
    for draw in range(args.max_draws):
        seed = args.seed + draw
        model, prompt, rules, spelling, experts_impl = build(seed, args.prompt_len)
        greedy_tokens, greedy_margin = greedy(model, prompt, args.new_tokens)
        sequence = torch.cat([prompt, greedy_tokens])
        with Probe(model) as probe:
            logits_all = forward_logits(model, sequence)
        moe_gap, indexer_gap = probe.moe_gap, probe.indexer_gap
        log(f"draw seed={seed}: greedy margin {greedy_margin:.4g}, MoE top-k gap {moe_gap:.4g}, "
            f"indexer top-k gap {indexer_gap:.4g}")
        if greedy_margin >= MIN_GREEDY_MARGIN and moe_gap >= MIN_MOE_GAP and indexer_gap >= MIN_INDEXER_GAP:
            break
    else:
        sys.exit(f"no draw in {args.max_draws} met the margins; raise --max-draws or relax the thresholds")

    log(f"config built with the {spelling}; experts implementation: {experts_impl}")
    log("lm_head shares storage with embed_tokens:",
        model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr())
    log("randomisation rules:")
    for name, rule in rules.items():
        log(f"  {name}: {rule}")

    # Prompt-only forward with activations recorded.
    with Probe(model) as probe:
        probe.record = True
        logits = forward_logits(model, prompt)
        with torch.no_grad():
            final_hidden = model.model(input_ids=prompt.unsqueeze(0), use_cache=False).last_hidden_state[0].float()
        probe.record = False
    records = probe.records

    # Consistency of the greedy tokens with one forward over the whole sequence.
    argmax_all = logits_all[len(prompt) - 1: -1].argmax(-1)
    log("greedy tokens equal argmax of the full-sequence forward:", bool((argmax_all == greedy_tokens).all()))
    log("prompt logits vs full-sequence logits (same positions), max abs diff:",
        float((logits - logits_all[: len(prompt)]).abs().max()))
    try:
        log("HF cached prefill+decode vs full forward, max abs logit diff:",
            cached_decode_check(model, prompt, greedy_tokens, logits_all))
    except Exception as e:  # noqa: BLE001 - informative only
        log(f"HF cached path failed: {type(e).__name__}: {e}")

    os.makedirs(args.out, exist_ok=True)
    # config.json exactly as save_pretrained writes it; also compare its tensor names with ours.
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        shutil.copy(os.path.join(tmp, "config.json"), os.path.join(args.out, "config.json"))
        try:
            from safetensors import safe_open

            hf_shapes = {}
            for fname in sorted(os.listdir(tmp)):
                if fname.endswith(".safetensors"):
                    with safe_open(os.path.join(tmp, fname), "pt") as f:
                        for k in f.keys():
                            hf_shapes[k] = tuple(f.get_slice(k).get_shape())
            ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            log("save_pretrained files:", sorted(os.listdir(tmp)))
            log("names only in save_pretrained output:", sorted(set(hf_shapes) - set(ours)))
            log("names only in state_dict:", sorted(set(ours) - set(hf_shapes)))
            log("shape mismatches:", {k: (ours[k], hf_shapes[k]) for k in set(ours) & set(hf_shapes)
                                      if ours[k] != hf_shapes[k]})
        except Exception as e:  # noqa: BLE001
            log(f"could not compare with save_pretrained output: {type(e).__name__}: {e}")

    tensors = {}
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            tensors[name] = t.to(torch.int64)
        elif FP32_STORED.search(name):
            tensors[name] = t.float()
        else:
            tensors[name] = t.to(torch.bfloat16)
    model_path = os.path.join(args.out, "model.safetensors")
    write_safetensors(model_path, tensors, {"format": "pt"})
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                   "weight_map": {name: "model.safetensors" for name in sorted(tensors)}}, f, indent=2)
        f.write("\n")

    golden = {
        "input_ids": prompt,
        "logits": logits,
        "greedy_tokens": greedy_tokens,
        "logits_all": logits_all,
        "final_hidden": final_hidden,
    }
    for key, value in records.items():
        golden[key] = value.float() if value.is_floating_point() else value.to(torch.int64)
    meta = {
        "producer": "tests/golden/make_fixture.py",
        "versions": versions,
        "seed": str(seed),
        "greedy_margin": f"{greedy_margin:.6g}",
        "moe_topk_gap": f"{moe_gap:.6g}",
        "indexer_topk_gap": f"{indexer_gap:.6g}",
        "notes": "logits: fp32 forward over input_ids (no cache). greedy_tokens: greedy continuation, full "
                 "forward per step, no EOS stop. logits_all: one forward over input_ids+greedy_tokens. "
                 "hidden_l{i}: [T, hc_mult, hidden] residual streams after layer i; attn_out_l{i}, moe_out_l{i}: "
                 "block outputs before hc_post; compressed_kv_l{i}: compressor entries after norm+rope; "
                 "indexer_topk_l{i}: HF top-k indices (-1 = invalid; order is HF's topk order); "
                 "moe_experts_l{i}/moe_weights_l{i}: routed experts and weights (after renorm and scaling). "
                 "All activations are for the prompt forward.",
    }
    write_safetensors(os.path.join(args.out, "golden.safetensors"), golden, meta)

    # The fixture must reproduce the golden logits when loaded back by transformers itself.
    try:
        from transformers import DeepseekV4ForCausalLM

        try:
            reloaded, info = DeepseekV4ForCausalLM.from_pretrained(args.out, dtype=torch.float32,
                                                                   output_loading_info=True)
        except TypeError:
            reloaded, info = DeepseekV4ForCausalLM.from_pretrained(args.out, torch_dtype=torch.float32,
                                                                   output_loading_info=True)
        reloaded.eval()
        set_eager_experts(reloaded)
        log("from_pretrained loading info:", {k: sorted(v) if isinstance(v, (set, list)) else v
                                              for k, v in info.items()})
        log("reloaded fixture vs golden logits, max abs diff:",
            float((forward_logits(reloaded, prompt) - logits).abs().max()))
    except Exception as e:  # noqa: BLE001
        log(f"reload check failed: {type(e).__name__}: {e}")

    log("\nconfig.json:")
    with open(os.path.join(args.out, "config.json")) as f:
        log(f.read())
    log("model.safetensors tensors:")
    for name, t in tensors.items():
        log(f"  {name} {str(t.dtype).replace('torch.', '')} {list(t.shape)}")
    log("golden.safetensors tensors:")
    for name, t in golden.items():
        log(f"  {name} {str(t.dtype).replace('torch.', '')} {list(t.shape)}")
    log("prompt:", prompt.tolist())
    log("greedy:", greedy_tokens.tolist())
    for fname in sorted(os.listdir(args.out)):
        log(f"{fname}: {os.path.getsize(os.path.join(args.out, fname))} bytes")


if __name__ == "__main__":
    main()

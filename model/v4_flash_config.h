// DeepSeek-V4-Flash's config.json as its checkpoint spells it (docs/model-v4.md section 1), for tests that
// need the real sizes without the checkpoint.
#pragma once

namespace dsmesh {

inline constexpr const char* kV4FlashConfigJson = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43, "num_nextn_predict_layers": 1,
  "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
  "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0],
  "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
  "rope_theta": 10000, "compress_rope_theta": 160000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 1048576, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
  "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 2048,
  "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": true,
  "routed_scaling_factor": 1.5, "num_hash_layers": 3, "swiglu_limit": 10.0,
  "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "hidden_act": "silu"
})";

}  // namespace dsmesh

// Tensor names. The model is described in DeepSeek's checkpoint naming (the one published checkpoints and
// EXL3 packs use: `layers.3.attn.wq_a.weight`, `layers.3.ffn.experts.7.w1.weight`, `mtp.0.e_proj.weight`);
// TransformersName() gives the spelling transformers' DeepseekV4ForCausalLM saves the same tensor under.
// The vision tower of DeepSeek-V4-Flash-Vision has one spelling only, the checkpoint's (vLLM loads it
// without renaming): vision.patch_embed.proj, vision.blocks.N.{norm1,norm2,attn.wqkv,attn.wo,mlp.w1,mlp.w2},
// vision.norm, aligner.{w1,w2}, and the sentinel embeddings image_{start,pad,newline,end}.
#pragma once

#include <string>

namespace dsmesh {

// The transformers name of a DeepSeek-named tensor, or "" when transformers has no separate tensor for it
// (routed experts are fused there: see TransformersExpertNames; mtp.* does not exist there).
std::string TransformersName(const std::string& deepseek_name);

// transformers fuses the routed experts of layer N into
//   model.layers.N.mlp.experts.gate_up_proj [E, 2I, D]  (rows [0, I) = w1, [I, 2I) = w3) and
//   model.layers.N.mlp.experts.down_proj    [E, D, I]   (= w2).
std::string TransformersGateUpName(int layer);
std::string TransformersDownName(int layer);

}  // namespace dsmesh

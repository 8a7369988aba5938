// Which tensors of a DeepSeek-V4 checkpoint (DeepSeek naming, docs/model-v4.md section 3) `dsmesh quantize` turns
// into EXL3, and at how many bits. Follows the reference deployment's pack (docs/reference-deployment.md section 1.2):
//   routed experts          layers.N.ffn.experts.E.{w1,w2,w3}, mtp.M.ffn.experts...      -> experts=K
//                           (layer.N=K overrides layer N, mtp=K the MTP blocks)
//   dense linears           attn.{wq_a,wq_b,wkv,wo_a,wo_b}, attn.compressor.{wkv,wgate},
//                           attn.indexer.{wq_b, compressor.wkv, compressor.wgate},
//                           ffn.shared_experts.{w1,w2,w3} (main and MTP blocks)          -> dense=K
//   lm head                 head.weight                                                -> head=K (optional)
//   embedding               embed.weight -> embed=fp8: F8_E4M3 + a per-row f32 `embed.scale` (fp8_blocks.h);
//                           embed=bf16 (the default) keeps it as stored
//   kept as stored          embed, head (unless asked), norms, hc_*, attn_sink, compressor ape, router
//                           gate/bias/tid2eid, indexer.weights_proj, mtp e_proj/h_proj
// The vocabulary (head rows) need not be a multiple of 128: EXL3 pads n to 128 with zero output scales, so
// padded logits are exactly 0 and are never read (the loader keeps out_features = vocab_size).
// A class whose K is 0 is kept as stored (Parse requires experts and dense; library callers may leave them 0).
#pragma once

#include <map>
#include <optional>
#include <string>

namespace dsmesh {

struct Exl3BitsSpec {
  int experts = 0, dense = 0;     // both required
  std::optional<int> mtp;         // routed experts of mtp.* blocks (default: experts)
  std::map<int, int> layer;       // routed experts of layers.N
  int head = 0;                   // lm head (head.weight); 0 = kept as stored
  bool embed_fp8 = false;         // embed.weight as F8_E4M3 with per-row scales

  // "experts=2,dense=6[,layer.13=3][,mtp=2][,head=6][,embed=fp8|bf16]"; throws std::invalid_argument
  // naming the bad item.
  static Exl3BitsSpec Parse(const std::string& text);
  std::string ToString() const;
};

enum class Exl3TensorClass { kKeep, kRoutedExpert, kDense, kHead };

struct Exl3TensorPlan {
  Exl3TensorClass cls = Exl3TensorClass::kKeep;
  int K = 0;           // bits when quantized
  std::string prefix;  // name without ".weight" when quantized
};

// Classifies one checkpoint tensor name.
Exl3TensorPlan PlanExl3Tensor(const std::string& name, const Exl3BitsSpec& bits);

// The top-level module a tensor belongs to ("layers.3", "mtp.0", or "" for embed/head/norm/hc_head), so a
// shard never splits a block.
std::string ModuleOf(const std::string& name);

}  // namespace dsmesh

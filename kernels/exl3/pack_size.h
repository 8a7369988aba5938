// The size of a `dsmesh quantize` pack by tensor class, so a size target (the trained model's <= 40 MB) is
// visible in the command's output, and the EXL3 size of a linear computed from its shape alone.
//   experts    routed experts (layers.N / mtp.M .ffn.experts.E.*), whatever their storage
//   dense      the dense linears quant_plan.h lists (attention, compressors, indexer wq_b, shared experts)
//   head       head.* (the lm head, bf16 or EXL3)
//   embedding  embed.* (bf16, or fp8 + its scale)
//   other      norms, hc parameters, sinks, ape, router, indexer weights_proj, mtp e_proj/h_proj, ...
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "kernels/exl3/codebook.h"

namespace dsmesh {

enum class PackClass { kExperts, kDense, kHead, kEmbedding, kOther };
constexpr int kPackClasses = 5;
const char* PackClassName(PackClass c);

// The class of a stored tensor name (`X.weight`, `X.trellis`, `X.suh`, `X.svh`, `X.mcg`, `X.mul1`, `X.scale`, ...).
PackClass PackClassOf(const std::string& stored_name);

struct PackBytes {
  std::array<int64_t, kPackClasses> by_class{};
  void Add(PackClass c, int64_t bytes) { by_class[static_cast<int>(c)] += bytes; }
  int64_t total() const;
  // "38.21 MB: experts 1.20 MB, dense 1.50 MB, head 8.27 MB, embedding 16.55 MB, other 0.20 MB" (MB = 10^6 bytes)
  std::string ToString() const;
};

// Bytes of an EXL3 [out, in] linear at K bits: trellis (k x n padded to 128, K bits each) + fp16 suh, svh
// + the 4-byte codebook marker (mcg, mul1; 3inst has none).
int64_t Exl3LinearBytes(int64_t out_features, int64_t in_features, int K, Exl3Codebook codebook = Exl3Codebook::kMcg);

}  // namespace dsmesh

// EXL3 linear layers on the CPU: load and validate a tensor set, y = x W, and the reference Ŵ.
//
// A quantized linear with key prefix P is stored as (docs/exl3-format.md §1.2):
//   P.trellis  int16 [k/16, n/16, 16K]  packed trellis, one 16x16 tile per [i, j]
//   P.suh      fp16  [k]                input-side signed scale
//   P.svh      fp16  [n]                output-side signed scale
//   P.mcg | P.mul1  int32 scalar        codebook marker (none = 3INST)
//   P.bias     fp16  [n]                optional
// k and n are padded to multiples of 128; W = diag(suh) Hk Ŵ Hn diag(svh) (Hk, Hn: block Hadamard 128,
// orthonormal). W is k x n (input x output), so y = x W: the transpose of an nn.Linear weight.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "common/tensor.h"
#include "kernels/exl3/codebook.h"

namespace dsmesh {

struct Exl3Weight {
  // True sizes seen by callers. x has in_features columns, y out_features; both are at most the padded
  // sizes k_padded()/n_padded() taken from the trellis. Without sizes from the model config they equal
  // the padded sizes.
  int64_t in_features = 0, out_features = 0;
  int K = 0;  // bits per weight, 1..8
  Exl3Codebook codebook = Exl3Codebook::k3Inst;
  Tensor trellis;              // int16 [k/16, n/16, 16K]
  Tensor suh;                  // fp16 [k]
  Tensor svh;                  // fp16 [n]
  std::optional<Tensor> bias;  // fp16 [n] (or [out_features])
  std::string name;            // key prefix, for error messages

  int64_t k_padded() const { return trellis.shape[0] * 16; }
  int64_t n_padded() const { return trellis.shape[1] * 16; }
};

// Looks a tensor up by full name; returns nullopt when absent. Lets one validator serve a Checkpoint,
// a single SafetensorsFile or tensors built in memory.
using TensorLookup = std::function<std::optional<Tensor>(const std::string& name)>;
TensorLookup LookupIn(const Checkpoint& ckpt);
TensorLookup LookupIn(const SafetensorsFile& file);

// True when prefix.trellis exists (the module is EXL3; LoadExl3Weight then checks the rest).
bool HasExl3Weight(const Checkpoint& ckpt, const std::string& prefix);

// Validates dtypes, ranks, shapes, K range, marker values and exclusivity; every error message names the
// offending tensor. in_features/out_features (optional, from the model config) must round up to the
// padded sizes; when given they become the weight's visible sizes.
Exl3Weight LoadExl3Weight(const Checkpoint& ckpt, const std::string& prefix, int64_t in_features = -1,
                          int64_t out_features = -1);
Exl3Weight LoadExl3Weight(const TensorLookup& lookup, const std::string& prefix, int64_t in_features = -1,
                          int64_t out_features = -1);

// y[m, out_features] = x[m, in_features] W (+ bias), fp32 in and out. Input and output Hadamards run in
// fp32 (no fp16 rounding of activations). Decodes tiles on the fly: for m <= 16 no more than one tile is
// decoded at a time per thread; larger m decodes one 16-column strip at a time. Uses every core of the
// exl3 thread pool (see parallel.h).
void Exl3LinearCpu(const Exl3Weight& w, const float* x, int64_t m, float* y);

// A tensor-parallel slice: input columns [in_begin, in_end) and output columns [out_begin, out_end) of
// the visible sizes (-1 = up to in_features / out_features). Any boundaries work; only the 128-blocks the
// slice touches are decoded, so 128-aligned slices cost exactly their share.
struct Exl3Slice {
  int64_t in_begin = 0, in_end = -1, out_begin = 0, out_end = -1;
  bool add_bias = true;  // a row-parallel (input-sliced) rank other than one should pass false
};
// y[m, out_end - out_begin] = x[m, in_end - in_begin] W[in_begin:in_end, out_begin:out_end] (+ bias slice).
void Exl3LinearCpu(const Exl3Weight& w, const float* x, int64_t m, float* y, const Exl3Slice& slice);

// Ŵ, the k_padded x n_padded rotated-basis matrix as fp16 bit patterns, row-major. Bit-exact with
// exllamav3's `reconstruct`.
std::vector<uint16_t> Exl3ReconstructFp16(const Exl3Weight& w);

// The original-basis weight W = diag(suh) Hk Ŵ Hn diag(svh), k_padded x n_padded, fp32, row-major
// (reference for tests and for dequantizing a pack back to dense).
std::vector<float> Exl3OriginalWeightF32(const Exl3Weight& w);

}  // namespace dsmesh

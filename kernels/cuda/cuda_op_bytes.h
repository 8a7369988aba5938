// The bytes (kernels/op_bytes.h) of the CUDA backend's operands that only the backend can see: weights as
// it holds them (an EXL3 linear's device parts) and KV rows in its paged pools. The op dispatch
// (cuda_backend.cc) adds them to the profiled op's bytes.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_exl3_weights.h"

namespace dsmesh {

// w's weights: an EXL3 linear's device parts (the Hadamard blocks of each output range used: the whole
// slice, or each of `groups` groups) with their bias, or a dense weight's elements and bias.
double HeldWeightBytes(Exl3Weights& exl3, const LinearWeight& w, int groups = 1);
// A linear on m rows: its weights and its activations.
double HeldLinearBytes(Exl3Weights& exl3, int64_t m, const LinearWeight& w);
// One row of a paged pool.
int64_t PoolRowBytes(const PagedRows& rows);
// The KV rows attention reads for n rows: the window's ring rows and the new rows, and the compressed
// entries (the selected ones, at most n x top-k, or all of them).
double AttentionKvBytes(int64_t n, int window, const Tensor& ring, const PagedRows* entries, int64_t num_entries,
                        const Tensor* topk);

}  // namespace dsmesh

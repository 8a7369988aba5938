// The device twin of the reference row sampler (kernels/sampling/row_sampler.h; the CPU backend's
// SampleRows): one block per logits row picks the token (greedy argmax, or the seeded draw after
// temperature, min_p, top_k and top_p) and the logprobs, so that only these leave the GPU. Tested against
// the CPU op in kernels/cuda/cuda_backend_test.cc.
//
// How a sampled row is searched without sorting 129,280 logits: the tokens of positive weight that pass
// min_p are compacted in id order; top_k, top_p and the draw are each a search for the first candidate
// (in the order larger key first, lower id first) where a running count or running integer weight
// crosses a target. A radix search over the 32-bit order key (4 passes of 8 bits, a histogram of counts
// and weights per pass) finds the key of that candidate; among candidates of exactly that key, which all
// weigh the same, the crossing index follows by division and is found by a scan in id order. Weights
// and their sums are integers (sampling_math.h), so the device reaches the same token as the host in
// any summation order: tokens agree exactly, ties included (lower id first on both sides).
// Logprobs: the log-sum-exp of the raw logits is summed in double in a tree (the host sums in a line),
// so logprobs agree to about one float ulp, not bitwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsmesh::cuda_ops {

// RowSampling (kernels/sampling/row_sampler.h) as the kernel reads it.
struct SampleRowParams {
  float temperature = 0;
  int32_t top_k = 0;
  float top_p = 1;
  float min_p = 0;
  uint64_t seed = 0;
  int64_t position = 0;
  int32_t logprobs = -1;
};

constexpr int kSampleMaxTopLogprobs = 20;

// What one row's sampling writes (the only bytes that come back to the host).
struct SampleRowOut {
  int32_t token = -1;
  float logprob = 0;
  int32_t top_ids[kSampleMaxTopLogprobs];
  float top_logprobs[kSampleMaxTopLogprobs];
};

// Device scratch SampleRows needs for `rows` rows of `vocab` logits (the compacted candidates).
int64_t SampleRowsScratchBytes(int64_t rows, int64_t vocab);

// logits f32 [rows, vocab] (row stride vocab), params and out [rows] device arrays.
void SampleRows(const float* logits, int64_t rows, int64_t vocab, const SampleRowParams* params, void* scratch,
                SampleRowOut* out, cudaStream_t s);

// ids[r] = the lowest id of the largest logit of row r (NaN never; 0 when the whole row is NaN): greedy
// SampleRows' choice, left on the device for the ops that take token ids from there.
void ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, cudaStream_t s);

}  // namespace dsmesh::cuda_ops

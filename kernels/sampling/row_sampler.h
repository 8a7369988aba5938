// The reference sampler of one logits row: the processed distribution (temperature, min_p, top_k,
// top_p over the integer weights of sampling_math.h), the seeded draw, and the logprobs of the raw
// logits. worker/sampler.cc applies penalties and grammar masks and then calls this; the CPU backend's
// SampleRows op is this; the CUDA kernels (kernels/cuda/sampling_ops.cu) are tested against it.
//
// The distribution of a sampled row:
//   x_i = logit_i / temperature (float; NaN as -inf), W_i = SampleWeight(x_i - max x) (integer, top 2^S);
//   candidates: the tokens with W_i > 0 and W_i >= MinPWeight(min_p), ordered by OrderKey(x_i), larger
//   first, lower id first among equal keys;
//   top_k > 0 keeps the first top_k candidates; 0 < top_p < 1 then keeps the shortest prefix whose
//   cumulative weight reaches TopPWeight(top_p, sum of all W);
//   the draw takes the first kept token whose cumulative weight exceeds DrawTarget(u, kept weight), u =
//   Uniform01(seed, position).
// A greedy row (temperature < kGreedyTemperature) takes the lowest id of the largest logit (NaN never).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/sampling/sampling_math.h"

namespace dsmesh {

// How one logits row is sampled (the per-row form of SamplingParams, without penalties or grammar).
struct RowSampling {
  float temperature = 0;  // below kGreedyTemperature: greedy
  int32_t top_k = 0;      // <= 0: off
  float top_p = 1;        // outside (0, 1): off
  float min_p = 0;        // <= 0: off
  uint64_t seed = 0;
  int64_t position = 0;   // position of the token being sampled: selects the random stream
  int32_t logprobs = -1;  // -1: none; 0: the sampled token's logprob; n > 0: also the top n (<= 20)
};

// What leaves the device per row.
struct SampledRow {
  int32_t token = -1;
  float logprob = 0;                 // when RowSampling::logprobs >= 0: log softmax of the raw logits
  std::vector<int32_t> top_ids;      // the top `logprobs` raw logits (larger first, lower id on ties)
  std::vector<float> top_logprobs;
};

// A processed distribution: the tokens a draw may take, in draw order, with integer-valued weights
// (sampling_math.h); p(ids[i]) = weights[i] / total. Greedy: one token of weight 1.
struct TokenDist {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double total = 0;
  double prob(size_t i) const { return weights[i] / total; }
};

// The distribution of `x` (vocab floats, penalties and masks already applied) under these parameters
// (seed, position and logprobs are not used).
TokenDist ProcessedRowDist(const float* x, int64_t vocab, const RowSampling& params);

// The first token of `d` whose cumulative weight exceeds u * total (u in [0, 1)); when rounding puts
// u * total at the total, the last token of positive weight.
int32_t DrawToken(const TokenDist& d, double u);

// The token the sampler picks from `x` (greedy or drawn by (seed, position)).
int32_t SampleRowToken(const float* x, int64_t vocab, const RowSampling& params);

// Log softmax of the raw logits at `token`, and the top `top_n` tokens by raw logit with theirs.
void RowLogprobs(const float* raw, int64_t vocab, int32_t token, int top_n, SampledRow* out);

// SampleRowToken plus, when asked, RowLogprobs: the CPU backend's SampleRows for one row.
SampledRow SampleRow(const float* raw, int64_t vocab, const RowSampling& params);

}  // namespace dsmesh

// Token sampling: penalties, then the row sampler of kernels/sampling/row_sampler.h (temperature, min_p,
// top_k, top_p over integer weights, and a draw from a random stream that depends only on (seed,
// position)). The same request therefore samples the same tokens whatever it is batched with, after a
// preemption that recomputes it, and on the device (Backend::SampleRows picks the same token as this for
// a row without penalties or mask). Temperature 0 is greedy (lowest id wins ties). The rejection sampler
// (rejection_sampler.h) works on the same ProcessedDist.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/sampling_params.h"
#include "kernels/sampling/row_sampler.h"
#include "proto/mesh.pb.h"

namespace dsmesh {

// What rank 0 keeps per sequence for the penalties: how often each token was generated, and which
// tokens the prompt holds.
struct PenaltyState {
  std::unordered_map<int32_t, int32_t> output_counts;
  std::unordered_map<int32_t, bool> prompt_tokens;
  void AddPromptToken(int32_t t) { prompt_tokens[t] = true; }
  void AddOutputToken(int32_t t) { ++output_counts[t]; }
};

struct SampleResult {
  int32_t token_id = -1;
  TokenLogprobs logprobs;  // filled when params ask for logprobs
};

// The per-row parameters of the row sampler (and of Backend::SampleRows) for a request at `position`.
RowSampling RowSamplingOf(const SamplingParams& params, uint64_t seed, int64_t position);

// Whether the penalties change these logits (then the row cannot be sampled from the raw logits).
bool Penalized(const SamplingParams& params, const PenaltyState& penalties);

// The distribution the sampler draws from at one position (TokenDist, row_sampler.h), after penalties:
// the tokens it may draw in draw order with integer weights. At temperature 0 it holds one token, the
// argmax of the penalized logits. `logits` are the model's raw logits for one position (vocab floats).
TokenDist ProcessedDist(const float* logits, int64_t vocab, const SamplingParams& params,
                        const PenaltyState& penalties);

// A row sampled by Backend::SampleRows (or SampleRow) as the logprobs of a SequenceResult.
void ToTokenLogprobs(const SampledRow& row, TokenLogprobs* out);

// `position` is the position of the token being sampled (its index in prompt + output), which selects
// the random stream.
SampleResult SampleToken(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t seed,
                         int64_t position, const PenaltyState& penalties);

}  // namespace dsmesh

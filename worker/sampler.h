// Token sampling: penalties, temperature, min_p, top_k, top_p (ProcessedDist), then a draw from a random
// stream that depends only on (seed, position) (random_stream.h). The same request therefore samples the same
// tokens whatever it is batched with, and after a preemption that recomputes it. Temperature 0 is greedy
// (lowest id wins ties). The rejection sampler (rejection_sampler.h) works on the same ProcessedDist.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/sampling_params.h"
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

// The distribution the sampler draws from at one position, after penalties, temperature, min_p, top_k and
// top_p: the tokens it may draw, most probable first (ties: lower id first), with unnormalized weights;
// p(ids[i]) = weights[i] / total. At temperature 0 it holds one token, the argmax of the penalized logits.
struct TokenDist {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double total = 0;
  double prob(size_t i) const { return weights[i] / total; }
};

struct SampleResult {
  int32_t token_id = -1;
  TokenLogprobs logprobs;  // filled when params ask for logprobs
};

// `logits` are the model's raw logits for one position (vocab floats); `position` is the position of the
// token being sampled (its index in prompt + output), which selects the random stream.
TokenDist ProcessedDist(const float* logits, int64_t vocab, const SamplingParams& params,
                        const PenaltyState& penalties);

// The first token of `d` whose cumulative weight exceeds u * total (u in [0, 1)).
int32_t DrawToken(const TokenDist& d, double u);

SampleResult SampleToken(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t seed,
                         int64_t position, const PenaltyState& penalties);

}  // namespace dsmesh

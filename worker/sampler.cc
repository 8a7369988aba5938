#include "worker/sampler.h"

#include <vector>

#include "kernels/cpu/argmax.h"
#include "kernels/sampling/random_stream.h"

namespace dsmesh {
namespace {

// The logits after the penalties (vLLM order): repetition over prompt and output, then frequency and
// presence over output.
std::vector<float> PenalizedLogits(const float* raw, int64_t vocab, const SamplingParams& p,
                                   const PenaltyState& pen) {
  std::vector<float> x(raw, raw + vocab);
  const float rep = p.repetition_penalty() == 0 ? 1.0f : p.repetition_penalty();
  if (rep != 1.0f) {
    auto penalize = [&](int32_t t) { x[t] = x[t] > 0 ? x[t] / rep : x[t] * rep; };
    std::unordered_map<int32_t, bool> seen = pen.prompt_tokens;
    for (const auto& [t, c] : pen.output_counts) seen[t] = true;
    for (const auto& [t, on] : seen)
      if (t >= 0 && t < vocab) penalize(t);
  }
  for (const auto& [t, c] : pen.output_counts) {
    if (t < 0 || t >= vocab) continue;
    x[t] -= p.frequency_penalty() * c + p.presence_penalty() * (c > 0 ? 1.0f : 0.0f);
  }
  return x;
}

}  // namespace

void ToTokenLogprobs(const SampledRow& r, TokenLogprobs* out) {
  out->set_token_id(r.token);
  out->set_logprob(r.logprob);
  for (size_t i = 0; i < r.top_ids.size(); ++i) {
    auto* t = out->add_top();
    t->set_token_id(r.top_ids[i]);
    t->set_logprob(r.top_logprobs[i]);
  }
}

RowSampling RowSamplingOf(const SamplingParams& p, uint64_t seed, int64_t position) {
  RowSampling r;
  r.temperature = p.temperature();
  r.top_k = p.top_k();
  r.top_p = p.top_p();
  r.min_p = p.min_p();
  r.seed = seed;
  r.position = position;
  r.logprobs = p.want_logprobs() || p.logprobs() > 0 ? p.logprobs() : -1;
  return r;
}

bool Penalized(const SamplingParams& p, const PenaltyState& pen) {
  return (p.repetition_penalty() != 0 && p.repetition_penalty() != 1.0f) ||
         ((p.frequency_penalty() != 0 || p.presence_penalty() != 0) && !pen.output_counts.empty());
}

TokenDist ProcessedDist(const float* raw, int64_t vocab, const SamplingParams& p, const PenaltyState& pen) {
  const RowSampling r = RowSamplingOf(p, 0, 0);
  if (!Penalized(p, pen)) return ProcessedRowDist(raw, vocab, r);
  const std::vector<float> x = PenalizedLogits(raw, vocab, p, pen);
  return ProcessedRowDist(x.data(), vocab, r);
}

SampleResult SampleToken(const float* raw, int64_t vocab, const SamplingParams& p, uint64_t seed,
                         int64_t position, const PenaltyState& pen) {
  const RowSampling r = RowSamplingOf(p, seed, position);
  // Without penalties this is exactly the row sampler (the device's SampleRows picks the same token);
  // with them the token comes from the penalized logits and the logprobs from the raw ones.
  SampledRow row;
  if (!Penalized(p, pen)) {
    row = SampleRow(raw, vocab, r);
  } else {
    const std::vector<float> x = PenalizedLogits(raw, vocab, p, pen);
    row.token = SampleRowToken(x.data(), vocab, r);
    if (r.logprobs >= 0) RowLogprobs(raw, vocab, row.token, r.logprobs, &row);
  }
  SampleResult result;
  result.token_id = row.token;
  if (r.logprobs >= 0) ToTokenLogprobs(row, &result.logprobs);
  return result;
}

}  // namespace dsmesh

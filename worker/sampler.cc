#include "worker/sampler.h"

#include "kernels/cpu/argmax.h"
#include "worker/random_stream.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace dsmesh {
namespace {

int32_t Argmax(const std::vector<float>& v) { return ::dsmesh::Argmax(v.data(), static_cast<int64_t>(v.size())); }

void FillLogprobs(const float* raw, int64_t vocab, int32_t token, int top_n, TokenLogprobs* out) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(raw[i]));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(raw[i]) - mx);
  const double log_z = mx + std::log(sum);
  out->set_token_id(token);
  out->set_logprob(static_cast<float>(raw[token] - log_z));
  if (top_n <= 0) return;
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t n = std::min<int64_t>(top_n, vocab);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                    [&](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
  for (int64_t i = 0; i < n; ++i) {
    auto* t = out->add_top();
    t->set_token_id(ids[i]);
    t->set_logprob(static_cast<float>(raw[ids[i]] - log_z));
  }
}

}  // namespace

TokenDist ProcessedDist(const float* raw, int64_t vocab, const SamplingParams& p, const PenaltyState& pen) {
  std::vector<float> x(raw, raw + vocab);
  // Penalties (vLLM order): repetition over prompt and output, then frequency and presence over output.
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
  TokenDist d;
  if (p.temperature() < 1e-5f) {
    d.ids = {Argmax(x)};
    d.weights = {1.0};
    d.total = 1.0;
    return d;
  }
  for (float& v : x) v /= p.temperature();
  const float mx = *std::max_element(x.begin(), x.end());
  std::vector<double> prob(vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += prob[i] = std::exp(static_cast<double>(x[i] - mx));
  for (double& q : prob) q /= sum;
  // Candidates sorted by probability (ties: lower id first), then cut by min_p, top_k, top_p.
  std::vector<int32_t>& ids = d.ids;
  ids.resize(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
  size_t keep = ids.size();
  if (p.min_p() > 0) {
    const double floor = p.min_p() * prob[ids[0]];
    while (keep > 1 && prob[ids[keep - 1]] < floor) --keep;
  }
  if (p.top_k() > 0) keep = std::min<size_t>(keep, p.top_k());
  if (p.top_p() > 0 && p.top_p() < 1) {
    double cum = 0;
    size_t k = 0;
    while (k < keep) {
      cum += prob[ids[k++]];
      if (cum >= p.top_p()) break;
    }
    keep = k;
  }
  ids.resize(keep);
  d.weights.resize(keep);
  for (size_t i = 0; i < keep; ++i) d.total += d.weights[i] = prob[ids[i]];
  return d;
}

int32_t DrawToken(const TokenDist& d, double u) {
  const double target = u * d.total;
  double cum = 0;
  int32_t last = d.ids.back();  // the last token of positive weight (u * total rounded up to total)
  for (size_t i = 0; i < d.ids.size(); ++i) {
    cum += d.weights[i];
    if (d.weights[i] > 0) last = d.ids[i];
    if (target < cum) return d.ids[i];
  }
  return last;
}

SampleResult SampleToken(const float* raw, int64_t vocab, const SamplingParams& p, uint64_t seed,
                         int64_t position, const PenaltyState& pen) {
  SampleResult result;
  const bool wants_logprobs = p.want_logprobs() || p.logprobs() > 0;
  const bool penalized = (p.repetition_penalty() != 0 && p.repetition_penalty() != 1.0f) ||
                         ((p.frequency_penalty() != 0 || p.presence_penalty() != 0) && !pen.output_counts.empty());
  if (p.temperature() < 1e-5f && !penalized) {
    // Greedy without penalties: the argmax of the raw logits, no copy (the common decode path).
    result.token_id = Argmax(raw, vocab);
  } else {
    result.token_id = DrawToken(ProcessedDist(raw, vocab, p, pen), Uniform01(seed, position));
  }
  if (wants_logprobs) FillLogprobs(raw, vocab, result.token_id, p.logprobs(), &result.logprobs);
  return result;
}

}  // namespace dsmesh

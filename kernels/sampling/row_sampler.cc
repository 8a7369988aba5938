#include "kernels/sampling/row_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/cpu/argmax.h"
#include "kernels/sampling/random_stream.h"

namespace dsmesh {

TokenDist ProcessedRowDist(const float* x_in, int64_t vocab, const RowSampling& p) {
  TokenDist d;
  if (p.temperature < sampling::kGreedyTemperature) {
    d.ids = {Argmax(x_in, vocab)};
    d.weights = {1.0};
    d.total = 1.0;
    return d;
  }
  std::vector<float> x(vocab);
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, x[i] = sampling::ScaledLogit(x_in[i], p.temperature));
  if (mx == -std::numeric_limits<float>::infinity()) {  // nothing drawable: the greedy answer
    d.ids = {Argmax(x_in, vocab)};
    d.weights = {1.0};
    d.total = 1.0;
    return d;
  }
  const int shift = sampling::WeightShift(vocab);
  const uint64_t min_w = std::max<uint64_t>(1, sampling::MinPWeight(p.min_p, shift));
  std::vector<uint64_t> w(vocab);
  uint64_t all = 0;
  std::vector<int32_t>& ids = d.ids;
  for (int64_t i = 0; i < vocab; ++i) {
    all += w[i] = sampling::SampleWeight(static_cast<double>(x[i] - mx), shift);
    if (w[i] >= min_w) ids.push_back(static_cast<int32_t>(i));
  }
  std::vector<uint32_t> key(vocab);
  for (int32_t i : ids) key[i] = sampling::OrderKey(x[i]);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); });
  size_t keep = ids.size();
  if (p.top_k > 0) keep = std::min<size_t>(keep, p.top_k);
  if (p.top_p > 0 && p.top_p < 1) {
    const uint64_t need = sampling::TopPWeight(p.top_p, all);
    uint64_t cum = 0;
    size_t k = 0;
    while (k < keep) {
      cum += w[ids[k++]];
      if (cum >= need) break;
    }
    keep = k;
  }
  ids.resize(keep);
  d.weights.resize(keep);
  uint64_t kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += w[ids[i]], d.weights[i] = static_cast<double>(w[ids[i]]);
  d.total = static_cast<double>(kept);  // exact: below 2^53
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

int32_t SampleRowToken(const float* x, int64_t vocab, const RowSampling& p) {
  if (p.temperature < sampling::kGreedyTemperature) return Argmax(x, vocab);
  return DrawToken(ProcessedRowDist(x, vocab, p), Uniform01(p.seed, p.position));
}

void RowLogprobs(const float* raw, int64_t vocab, int32_t token, int top_n, SampledRow* out) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(raw[i]));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(raw[i]) - mx);
  const double log_z = mx + std::log(sum);
  out->token = token;
  out->logprob = static_cast<float>(raw[token] - log_z);
  out->top_ids.clear();
  out->top_logprobs.clear();
  if (top_n <= 0) return;
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t n = std::min<int64_t>(top_n, vocab);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                    [&](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
  for (int64_t i = 0; i < n; ++i) {
    out->top_ids.push_back(ids[i]);
    out->top_logprobs.push_back(static_cast<float>(raw[ids[i]] - log_z));
  }
}

SampledRow SampleRow(const float* raw, int64_t vocab, const RowSampling& p) {
  SampledRow r;
  r.token = SampleRowToken(raw, vocab, p);
  if (p.logprobs >= 0) RowLogprobs(raw, vocab, r.token, p.logprobs, &r);
  return r;
}

}  // namespace dsmesh

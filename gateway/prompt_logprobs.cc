#include "gateway/prompt_logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dsmesh {

PromptLogprobs::PromptLogprobs(std::vector<int> prompt, int k, std::function<std::string(int)> decode)
    : prompt_(std::move(prompt)), k_(k), decode_(std::move(decode)), entries_(prompt_.size()) {}

void PromptLogprobs::AddRow(int64_t position, const float* v, int64_t vocab) {
  const int64_t j = position + 1;  // the prompt token this row predicts
  if (position < 0 || j >= static_cast<int64_t>(prompt_.size()) || entries_[j]) return;
  double mx = v[0];
  for (int64_t i = 1; i < vocab; ++i) mx = std::max<double>(mx, v[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(v[i] - mx);
  const double lse = mx + std::log(sum);
  auto item = [&](int id) {
    int64_t rank = 1;
    for (int64_t i = 0; i < vocab; ++i) rank += v[i] > v[id];
    return nlohmann::json{{"logprob", v[id] - lse}, {"rank", rank}, {"decoded_token", decode_(id)}};
  };
  nlohmann::json entry = nlohmann::json::object();
  const int token = prompt_[j];
  entry[std::to_string(token)] = token >= 0 && token < vocab ? item(token) : nlohmann::json(nullptr);
  if (k_ > 0) {
    std::vector<int> top(vocab);
    std::iota(top.begin(), top.end(), 0);
    const int64_t k = std::min<int64_t>(k_, vocab);
    std::partial_sort(top.begin(), top.begin() + k, top.end(), [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    for (int64_t i = 0; i < k; ++i)
      if (!entry.contains(std::to_string(top[i]))) entry[std::to_string(top[i])] = item(top[i]);
  }
  entries_[j] = std::move(entry);
}

std::optional<int64_t> PromptLogprobs::FirstMissing() const {
  for (size_t j = 1; j < entries_.size(); ++j)
    if (!entries_[j]) return static_cast<int64_t>(j) - 1;
  return std::nullopt;
}

nlohmann::json PromptLogprobs::ToJson() const {
  nlohmann::json out = nlohmann::json::array();
  for (size_t j = 0; j < entries_.size(); ++j) out.push_back(j == 0 || !entries_[j] ? nlohmann::json(nullptr) : *entries_[j]);
  return out;
}

}  // namespace dsmesh

// vLLM's `prompt_logprobs` (completions extension): for every prompt token after the first, its logprob
// under the model given the tokens before it, its rank, and the top-k alternatives, from the full-vocabulary
// logits rows the mesh returns for the prompt positions (GenerateRequest.return_logits). The JSON is vLLM's:
//   [null, {"<id>": {"logprob": -3.2, "rank": 5, "decoded_token": "foo"}, ...}, ...]
// one entry per prompt token; entry j (j >= 1) comes from the row of position j - 1, and holds the prompt
// token itself plus the k most likely tokens (k = 0: the prompt token only). Logprobs are of the raw logits
// (log-softmax in double), ranks 1-based (1 + the number of tokens with a larger logit).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace dsmesh {

class PromptLogprobs {
 public:
  PromptLogprobs(std::vector<int> prompt, int k, std::function<std::string(int)> decode);

  // One logits row of `position` (vocab values). Rows of positions >= prompt.size() - 1 (they predict
  // generated tokens) are ignored; so is a repeated row.
  void AddRow(int64_t position, const float* values, int64_t vocab);

  // Missing rows: the first prompt position without one, or nullopt when complete.
  std::optional<int64_t> FirstMissing() const;
  nlohmann::json ToJson() const;

 private:
  std::vector<int> prompt_;
  int k_;
  std::function<std::string(int)> decode_;
  std::vector<std::optional<nlohmann::json>> entries_;  // entries_[j] for prompt token j (j >= 1)
};

}  // namespace dsmesh

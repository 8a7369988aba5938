#include "coordinator/speculative_config.h"

#include <nlohmann/json.hpp>

#include "common/flags.h"

namespace dsmesh {

SpeculativeConfig ParseSpeculativeConfig(const std::string& text, int64_t vocab_size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw UsageError(std::string("--speculative-config: invalid JSON: ") + e.what());
  }
  if (!j.is_object()) throw UsageError("--speculative-config: expected a JSON object");
  const std::string method = j.contains("method") && j["method"].is_string() ? j["method"].get<std::string>() : "";
  if (method != "mtp" && method != "deepseek_mtp")
    throw UsageError("--speculative-config: method \"" + method + "\" is not supported (use \"mtp\")");
  SpeculativeConfig config;
  if (j.contains("num_speculative_tokens")) {
    if (!j["num_speculative_tokens"].is_number_integer())
      throw UsageError("--speculative-config: num_speculative_tokens must be an integer");
    config.num_speculative_tokens = j["num_speculative_tokens"].get<int>();
  }
  if (config.num_speculative_tokens < 1 || config.num_speculative_tokens > 16)
    throw UsageError("--speculative-config: num_speculative_tokens must be in 1..16");
  if (j.contains("draft_vocab_size") && !j["draft_vocab_size"].is_null()) {
    const nlohmann::json& v = j["draft_vocab_size"];
    if (!v.is_number_integer())
      throw UsageError("--speculative-config: draft_vocab_size must be an integer (0: the whole vocabulary), got " +
                       v.dump());
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) : v.get<int64_t>() < 0)
      throw UsageError("--speculative-config: draft_vocab_size must be >= 0 (0: the whole vocabulary), got " +
                       v.dump());
    config.draft_vocab_size = v.get<int64_t>();
  }
  if (vocab_size > 0 && config.draft_vocab_size > vocab_size)
    throw UsageError("--speculative-config: draft_vocab_size " + std::to_string(config.draft_vocab_size) +
                     " is larger than the model's vocabulary (" + std::to_string(vocab_size) + " ids)");
  return config;
}

}  // namespace dsmesh

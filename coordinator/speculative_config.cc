#include "coordinator/speculative_config.h"

#include <nlohmann/json.hpp>

#include "common/flags.h"

namespace dsmesh {

int ParseSpeculativeConfig(const std::string& text) {
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
  int k = 3;
  if (j.contains("num_speculative_tokens")) {
    if (!j["num_speculative_tokens"].is_number_integer())
      throw UsageError("--speculative-config: num_speculative_tokens must be an integer");
    k = j["num_speculative_tokens"].get<int>();
  }
  if (k < 1 || k > 16) throw UsageError("--speculative-config: num_speculative_tokens must be in 1..16");
  return k;
}

}  // namespace dsmesh

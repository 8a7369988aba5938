#include "gateway/request_limits.h"

#include <algorithm>
#include <string>

#include "gateway/api_error.h"

namespace dsmesh {

int CheckRequestLimits(const StatsResponse& stats, int prompt_len, const RequestOptions& options, bool chat) {
  const std::string prompt_field = chat ? "messages" : "prompt";
  if (options.priority != 0 && !stats.scheduling_policy().empty() && stats.scheduling_policy() != "priority")
    throw BadRequest("Got priority " + std::to_string(options.priority) +
                         " but Priority scheduling is not enabled (the coordinator runs --scheduling-policy " +
                         stats.scheduling_policy() + ").",
                     "priority");
  const long long asked = options.max_tokens ? static_cast<long long>(prompt_len) + *options.max_tokens : 0;
  const int max_len = stats.max_model_len();
  if (max_len > 0) {
    if (prompt_len >= max_len)
      throw BadRequest("This model's maximum context length is " + std::to_string(max_len) +
                           " tokens. However, your prompt has " + std::to_string(prompt_len) +
                           " tokens, which leaves no room for the completion. Please reduce the length of the " +
                           prompt_field + ".",
                       prompt_field, std::string("context_length_exceeded"));
    if (options.max_tokens && asked > max_len)
      throw BadRequest("This model's maximum context length is " + std::to_string(max_len) +
                           " tokens. However, you requested " + std::to_string(asked) + " tokens (" +
                           std::to_string(prompt_len) + " in the " + prompt_field + ", " +
                           std::to_string(*options.max_tokens) + " in the completion). Please reduce the length of " +
                           "the " + prompt_field + " or completion.",
                       "max_tokens", std::string("context_length_exceeded"));
  }
  const long long pool = stats.max_seq_tokens();
  if (pool > 0) {
    const long long need = options.max_tokens ? asked : static_cast<long long>(prompt_len) + 1;
    if (need > pool)
      throw BadRequest("The KV cache holds at most " + std::to_string(pool) +
                           " tokens for one sequence. However, you requested " + std::to_string(need) + " tokens (" +
                           std::to_string(prompt_len) + " in the " + prompt_field + ", " +
                           std::to_string(need - prompt_len) + " in the completion), so the request could never " +
                           "run. Please reduce the length of the " + prompt_field + " or completion.",
                       options.max_tokens ? "max_tokens" : prompt_field, std::string("context_length_exceeded"));
  }
  if (options.max_tokens) return *options.max_tokens;
  const long long reach = pool > 0 ? pool : max_len;
  return reach > 0 ? static_cast<int>(reach - prompt_len) : 0;
}

}  // namespace dsmesh

// vLLM's --speculative-config JSON, as the coordinator and `dsmesh bench` read it.
#pragma once

#include <string>

namespace dsmesh {

// Only method "mtp" (the checkpoint's MTP block; "deepseek_mtp" too) is served here. Returns the drafts
// per step (num_speculative_tokens, 3 when omitted). Throws UsageError naming the flag.
int ParseSpeculativeConfig(const std::string& text);

}  // namespace dsmesh

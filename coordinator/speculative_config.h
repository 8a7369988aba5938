// vLLM's --speculative-config JSON, as the coordinator and `dsmesh bench` read it.
#pragma once

#include <cstdint>
#include <string>

namespace dsmesh {

struct SpeculativeConfig {
  int num_speculative_tokens = 3;  // drafts per step
  // The drafts' vocabulary: head rows [0, draft_vocab_size) (the most frequent ids of a byte-level BPE
  // vocabulary), replicated on every rank for the MTP passes; verification keeps the whole head.
  // 0: the whole vocabulary (EAGLE-3 / vLLM's key of the same name).
  int64_t draft_vocab_size = 0;
};

// Only method "mtp" (the checkpoint's MTP block; "deepseek_mtp" too) is served here. num_speculative_tokens
// is 3 when omitted; draft_vocab_size 0 (the whole vocabulary). `vocab_size` (> 0 when the model is known)
// bounds draft_vocab_size. Throws UsageError naming the flag and the key.
SpeculativeConfig ParseSpeculativeConfig(const std::string& text, int64_t vocab_size = 0);

}  // namespace dsmesh

#include "coordinator/mixed_step_budget.h"

#include <algorithm>
#include <cmath>

namespace dsmesh {

void MixedStepBudget::Observe(int64_t decode_rows, int64_t prefill_tokens, double seconds) {
  if (!(seconds >= 0) || (decode_rows <= 0 && prefill_tokens <= 0)) return;
  if (prefill_tokens <= 0) {
    decode_s_ = decode_s_ * decay_ + seconds;
    decode_w_ = decode_w_ * decay_ + 1;
    return;
  }
  // The decodes' share of a mixed step is what a decode-only step takes; without a measured one yet the
  // whole step is charged to its prefill tokens (an overestimate: a smaller cap, never a larger one).
  const double decodes = decode_rows > 0 ? decode_step_seconds() : 0;
  const double per_token = std::max(0.0, seconds - decodes) / static_cast<double>(prefill_tokens);
  token_s_ = token_s_ * decay_ + per_token;
  token_w_ = token_w_ * decay_ + 1;
}

int64_t MixedStepBudget::Cap() const {
  if (!on() || decode_w_ <= 0 || token_w_ <= 0) return kNoCap;
  const double per_token = prefill_token_seconds();
  if (per_token <= 0) return kNoCap;
  const double tokens = std::floor((ratio_ - 1) * decode_step_seconds() / per_token);
  if (!(tokens < 1e15)) return kNoCap;
  return std::max<int64_t>(kMinTokens, static_cast<int64_t>(tokens));
}

}  // namespace dsmesh

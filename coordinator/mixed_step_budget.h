// How many prefill tokens a step may carry beside decoding sequences so that it takes at most `ratio`
// times a decode-only step (--max-decode-slowdown): the decoding streams' time per token stays bounded
// while a long prompt is prefilled beside them, at the cost of that prompt's time to first token. The
// token budget of the fair order (--long-prefill-token-threshold) bounds tokens; this bounds time, as
// Sarathi-Serve sizes its stall-free batches by the time-between-tokens target.
//
// Both costs are measured, never guessed: an exponentially decayed mean of decode-only steps' times, and
// of the seconds per prefill token of steps that carried prefill (the step's time less a decode-only
// step's when decodes rode along). Until both have a sample, and with ratio <= 1 (off), there is no cap.
// A capped step still carries at least kMinTokens prefill tokens, so every prompt progresses.
#pragma once

#include <cstdint>
#include <limits>

namespace dsmesh {

class MixedStepBudget {
 public:
  static constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();
  static constexpr int64_t kMinTokens = 16;

  // ratio <= 1: off (Cap() never caps). decay: the weight older samples keep per new one.
  explicit MixedStepBudget(double ratio, double decay = 0.9) : ratio_(ratio), decay_(decay) {}

  // One step's measured wall time, its decode rows (newest tokens and drafts of decoding sequences) and
  // prefill tokens.
  void Observe(int64_t decode_rows, int64_t prefill_tokens, double seconds);

  // Prefill tokens a step with decoding sequences may carry (kNoCap when off or not yet measured).
  int64_t Cap() const;

  bool on() const { return ratio_ > 1; }
  double decode_step_seconds() const { return decode_w_ > 0 ? decode_s_ / decode_w_ : 0; }
  double prefill_token_seconds() const { return token_w_ > 0 ? token_s_ / token_w_ : 0; }

 private:
  double ratio_, decay_;
  double decode_s_ = 0, decode_w_ = 0;  // decayed sums: decode-only step seconds, and their weight
  double token_s_ = 0, token_w_ = 0;    // decayed sums: seconds per prefill token, and their weight
};

}  // namespace dsmesh

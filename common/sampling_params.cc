#include "common/sampling_params.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dsmesh {

void ValidateSamplingParams(const SamplingParams& p, int64_t vocab) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("sampling." + what); };
  if (!(p.temperature() >= 0) || !std::isfinite(p.temperature())) bad("temperature must be >= 0");
  if (p.top_p() != 0 && !(p.top_p() > 0 && p.top_p() <= 1)) bad("top_p must be in (0, 1]");
  if (p.top_k() < -1) bad("top_k must be -1, 0 (off) or positive");
  if (!(p.min_p() >= 0 && p.min_p() <= 1)) bad("min_p must be in [0, 1]");
  if (!(p.presence_penalty() >= -2 && p.presence_penalty() <= 2)) bad("presence_penalty must be in [-2, 2]");
  if (!(p.frequency_penalty() >= -2 && p.frequency_penalty() <= 2)) bad("frequency_penalty must be in [-2, 2]");
  if (p.repetition_penalty() != 0 && !(p.repetition_penalty() > 0 && std::isfinite(p.repetition_penalty())))
    bad("repetition_penalty must be > 0");
  if (p.max_tokens() < 0) bad("max_tokens must be >= 0");
  if (p.logprobs() < 0 || p.logprobs() > 20) bad("logprobs must be in [0, 20]");
  for (int32_t t : p.stop_token_ids())
    if (t < 0 || t >= vocab) bad("stop_token_ids: " + std::to_string(t) + " is outside the vocabulary");
}

}  // namespace dsmesh

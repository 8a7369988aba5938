#include "coordinator/simulated_acceptance.h"

#include <cmath>
#include <stdexcept>

#include "common/flags.h"

namespace dsmesh {

std::vector<double> ParseDraftAcceptance(const std::string& text, int drafts, const std::string& flag) {
  std::vector<double> rates;
  std::string before;  // the items already read, for the error message
  for (const std::string& item : SplitCommaList(text)) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || !std::isfinite(v))
      throw std::invalid_argument(flag + ": \"" + item + "\" is not a number (expected rates like 0.85,0.70,0.55)");
    if (v < 0 || v > 1) throw std::invalid_argument(flag + ": rate " + item + " is outside [0, 1]");
    if (!rates.empty() && v > rates.back())
      throw std::invalid_argument(flag + ": rates must be non-increasing (draft i+1 can pass only where draft i "
                                  "did), got " + item + " after " + before);
    rates.push_back(v);
    before += (before.empty() ? "" : ",") + item;
  }
  if (static_cast<int>(rates.size()) != drafts)
    throw std::invalid_argument(flag + ": " + std::to_string(rates.size()) + " rate(s) for " + std::to_string(drafts) +
                                " draft(s) per step (num_speculative_tokens); give one per draft position");
  return rates;
}

int AcceptanceSimulator::Draw(int drafts) {
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  int passed = 0;
  while (passed < drafts && passed < static_cast<int>(rates_.size()) && u < rates_[passed]) ++passed;
  return passed;
}

}  // namespace dsmesh

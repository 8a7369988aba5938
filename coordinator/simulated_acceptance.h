// Simulated draft acceptance, for `dsmesh bench --draft-acceptance 0.85,0.70,0.55` only: draft position i
// passes in the given fraction of verification steps (vLLM's per-position acceptance rate: drafts
// accepted at position i / verification steps). The rates are non-increasing, so one uniform draw u per
// verification step decides them all: positions i with u < rate_i pass, always a prefix, and
// P(position i passes) = rate_i exactly; the mean accepted length is 1 + sum of the rates.
// The scheduler draws the count and puts it in the plan (SequencePlan.simulated_acceptance); the worker,
// started for the bench, emits the target's own token at each passing row. Serving never builds one:
// the coordinator takes the rates only from its --bench-draft-acceptance flag, which `dsmesh up` does not
// pass, and workers refuse such plans unless started with --bench-simulated-acceptance.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dsmesh {

// "0.85,0.70,0.55" -> {0.85, 0.7, 0.55}. Throws std::invalid_argument (a usage message naming `flag`)
// unless there are exactly `drafts` rates, each in [0, 1], non-increasing.
std::vector<double> ParseDraftAcceptance(const std::string& text, int drafts, const std::string& flag);

class AcceptanceSimulator {
 public:
  AcceptanceSimulator(std::vector<double> rates, uint64_t seed) : rates_(std::move(rates)), rng_(seed) {}
  // Drafts that pass out of `drafts` proposed (a prefix); one draw per verification step.
  int Draw(int drafts);
  const std::vector<double>& rates() const { return rates_; }

 private:
  std::vector<double> rates_;
  std::mt19937_64 rng_;
};

}  // namespace dsmesh

// Speculation never costs speed: how many MTP drafts a decoding sequence proposes for its next step.
//
// Each sequence keeps a running estimate of its acceptance per draft position (conditional: position i
// is only judged when positions 0..i-1 passed), decayed per step so recent steps weigh most. The step's
// cost comes from measurement (StepCostModel): the decode step's time (everything but drafting) as
// base + per_row x rows, fitted over recent decode-only steps, and the time of one draft pass. A
// sequence proposes the k in 0..max_drafts that maximizes its expected tokens per second,
//   E(k) = 1 + sum_{i<k} prod_{j<=i} alpha_j    over    T(k) = base / S + k x draft_pass / D + per_row x (1 + k)
// (S decoding sequences share the step's base, the D of them that draft share the batched draft passes),
// and k = 0 unless some k > 0 beats it by `margin`. Two forced choices keep the figures honest:
//   probe:     below max_drafts, every probe interval steps it proposes all of them once, so a sequence
//              whose text became predictable recovers; the interval doubles while probes change nothing
//              (probe_interval_min .. probe_interval_max) and resets when one raises the drafts, and is
//              never shorter than keeps the probes' extra time within probe_budget;
//   calibrate: while the rows of recent steps are too alike to separate base from per_row (one stream
//              always verifying 1 + k rows), a speculating sequence proposes none once every
//              calibrate_every steps, so the step without drafts is measured too.
// Every decision is counted by kind (DraftDecision) in the coordinator's stats
// (vllm:spec_decode_draft_decisions_total{decision=...} on the gateway's /metrics).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace dsmesh {

struct DraftPolicyConfig {
  int max_drafts = 3;               // num_speculative_tokens
  bool adaptive = true;             // false: always max_drafts (vLLM's behaviour; --draft-policy fixed)
  double acceptance_decay = 0.98;   // per step, the weight older acceptance evidence keeps
  double cost_decay = 0.99;         // per decode step, the weight older cost samples keep
  double margin = 0.03;             // speculate only when it wins by more than this (relative)
  int probe_interval_min = 8;
  int probe_interval_max = 256;
  double probe_budget = 0.01;       // probes take at most this share of the time (cost-aware interval)
  int calibrate_every = 64;         // at most one step without drafts this often (about 1% of one stream's)
  double min_row_spread = 0.02;     // variance of rows (decayed) needed to fit per_row
};

enum class DraftDecision { kFull, kReduced, kOff, kProbe, kCalibrate };
constexpr int kNumDraftDecisions = 5;
// "full", "reduced", "off", "probe", "calibrate": the metric's label values.
const char* DraftDecisionName(DraftDecision d);

// The measured cost of a decode step, from the coordinator's step time and rank 0's draft time.
class StepCostModel {
 public:
  explicit StepCostModel(const DraftPolicyConfig& config) : config_(config) {}
  // One decode-only step: `rows` verified rows (newest tokens + drafts of every sequence), its time
  // without drafting, and the draft passes it ran (most drafts any sequence proposed) and their time.
  void Observe(int64_t rows, double seconds_without_drafts, int draft_passes, double draft_seconds);
  // Draft passes of a step that is not decode-only (a prefill's last chunk drafts too).
  void ObserveDrafts(int draft_passes, double draft_seconds);
  bool has_steps() const { return w_ > 0; }
  // Variance of the recent rows (decayed); at min_row_spread or more, base and per_row are told apart.
  double row_spread() const;
  bool rows_fitted() const;
  // Seconds per verified row: the last fit (before the rows ever spread enough to fit it, the whole
  // step's time divided by its rows: no drafts bought on a guess).
  double per_row() const;
  // Seconds of a step beside its rows: the line of slope per_row() through the recent mean.
  double base() const;
  double draft_pass() const { return draft_w_ > 0 ? draft_s_ / draft_w_ : 0; }  // seconds per draft pass

 private:
  DraftPolicyConfig config_;
  double w_ = 0, sx_ = 0, sxx_ = 0, sy_ = 0, sxy_ = 0;  // decayed least squares of seconds on rows
  double draft_w_ = 0, draft_s_ = 0;                    // decayed draft passes and their seconds
  bool ever_fitted_ = false;
  double fitted_per_row_ = 0;
};

// One sequence's acceptance estimate and its draft decisions.
class SequenceDraftPolicy {
 public:
  explicit SequenceDraftPolicy(const DraftPolicyConfig& config);
  // A verification step: `proposed` drafts were verified and the first `accepted` of them passed.
  void ObserveVerification(int proposed, int accepted);
  // Conditional acceptance of position i (given 0..i-1 passed); 1 before any evidence (start speculating).
  double acceptance(int position) const;
  // Expected tokens a step with k drafts produces (1 + accepted drafts).
  double ExpectedTokens(int k) const;
  // The drafts to propose after this step: `decoding_seqs` share the step's base, `drafting_seqs` (this
  // one counted) its draft passes. Call once per step in which the sequence samples.
  int Decide(const StepCostModel& cost, int decoding_seqs, int drafting_seqs, DraftDecision* decision);
  int current() const { return current_; }

 private:
  DraftPolicyConfig config_;
  std::vector<double> accepted_, judged_;  // decayed counts per position
  int current_;                             // drafts proposed by the last decision
  int below_max_steps_ = 0;                 // decisions below max_drafts since the last probe or full choice
  int probe_interval_;
  bool probe_sent_ = false;                 // a probe's drafts are not verified yet
  bool judge_probe_ = false;                // they are: the next decision judges the probe
  int before_probe_ = 0;                    // what the probe's step would have proposed without it
  int since_calibrate_;
};

}  // namespace dsmesh

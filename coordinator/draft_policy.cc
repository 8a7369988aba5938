#include "coordinator/draft_policy.h"

#include <algorithm>

namespace dsmesh {

const char* DraftDecisionName(DraftDecision d) {
  switch (d) {
    case DraftDecision::kFull: return "full";
    case DraftDecision::kReduced: return "reduced";
    case DraftDecision::kOff: return "off";
    case DraftDecision::kProbe: return "probe";
    case DraftDecision::kCalibrate: return "calibrate";
  }
  return "?";
}

void StepCostModel::Observe(int64_t rows, double seconds_without_drafts, int draft_passes, double draft_seconds) {
  const double a = config_.cost_decay, x = static_cast<double>(rows), y = std::max(seconds_without_drafts, 0.0);
  w_ = a * w_ + 1;
  sx_ = a * sx_ + x;
  sxx_ = a * sxx_ + x * x;
  sy_ = a * sy_ + y;
  sxy_ = a * sxy_ + x * y;
  ObserveDrafts(draft_passes, draft_seconds);
  if (rows_fitted()) {
    const double mx = sx_ / w_;
    fitted_per_row_ = std::max(0.0, (sxy_ / w_ - mx * sy_ / w_) / (sxx_ / w_ - mx * mx));
    ever_fitted_ = true;
  }
}

void StepCostModel::ObserveDrafts(int draft_passes, double draft_seconds) {
  if (draft_passes <= 0) return;
  draft_w_ = config_.cost_decay * draft_w_ + draft_passes;
  draft_s_ = config_.cost_decay * draft_s_ + std::max(draft_seconds, 0.0);
}

double StepCostModel::row_spread() const {
  if (w_ <= 0) return 0;
  const double mx = sx_ / w_;
  return sxx_ / w_ - mx * mx;
}

bool StepCostModel::rows_fitted() const { return w_ > 0 && row_spread() >= config_.min_row_spread; }

// Before the rows ever spread, all of a step's time counts as rows: the pessimistic reading (a CPU's,
// where rows cost nearly linearly), so drafts are not bought on a guess; the steps that follow (fewer
// drafts, fewer rows) fit the real slope.
double StepCostModel::per_row() const {
  if (ever_fitted_) return fitted_per_row_;
  return sx_ > 0 ? sy_ / sx_ : 0.0;
}

double StepCostModel::base() const {
  if (w_ <= 0) return 0;
  // The line through the recent mean with the fitted slope: the level follows the newest steps even
  // while their rows are too alike to fit the slope again.
  return std::max(1e-9, sy_ / w_ - per_row() * sx_ / w_);
}

SequenceDraftPolicy::SequenceDraftPolicy(const DraftPolicyConfig& config)
    : config_(config),
      accepted_(std::max(config.max_drafts, 0), 1.0),  // one optimistic pseudo-observation: start speculating
      judged_(std::max(config.max_drafts, 0), 1.0),
      current_(std::max(config.max_drafts, 0)),
      probe_interval_(config.probe_interval_min),
      // The first calibration comes a few steps in, so the step without drafts is known early.
      since_calibrate_(std::max(0, config.calibrate_every - 4)) {}

void SequenceDraftPolicy::ObserveVerification(int proposed, int accepted) {
  proposed = std::min(proposed, static_cast<int>(judged_.size()));
  for (int i = 0; i < proposed && i <= accepted; ++i) {
    judged_[i] += 1;
    if (i < accepted) accepted_[i] += 1;
  }
  if (probe_sent_ && proposed > 0) {
    probe_sent_ = false;
    judge_probe_ = true;
  }
}

double SequenceDraftPolicy::acceptance(int position) const {
  const double n = judged_.at(position);
  return n > 1e-12 ? accepted_[position] / n : 1.0;
}

double SequenceDraftPolicy::ExpectedTokens(int k) const {
  double e = 1, reach = 1;
  for (int i = 0; i < k && i < static_cast<int>(judged_.size()); ++i) {
    reach *= acceptance(i);
    e += reach;
  }
  return e;
}

int SequenceDraftPolicy::Decide(const StepCostModel& cost, int decoding_seqs, int drafting_seqs,
                                DraftDecision* decision) {
  const int K = static_cast<int>(judged_.size());
  // Evidence fades per step, observed or not: the ratios stay, but after a long time without drafts the
  // next observation (a probe) outweighs the old ones.
  for (int i = 0; i < K; ++i) {
    accepted_[i] *= config_.acceptance_decay;
    judged_[i] *= config_.acceptance_decay;
  }
  int best = K;
  const double S = std::max(decoding_seqs, 1), D = std::max(drafting_seqs, 1);
  auto seconds = [&](int k) { return cost.base() / S + k * cost.draft_pass() / D + cost.per_row() * (1 + k); };
  if (cost.has_steps() && K > 0) {
    const double off_rate = 1.0 / seconds(0);
    double best_rate = 0;
    best = 0;
    for (int k = 1; k <= K; ++k) {
      const double rate = ExpectedTokens(k) / seconds(k);
      if (rate > best_rate) best_rate = rate, best = k;
    }
    if (best_rate <= off_rate * (1 + config_.margin)) best = 0;
  }
  DraftDecision d = best == K ? DraftDecision::kFull : best == 0 ? DraftDecision::kOff : DraftDecision::kReduced;
  if (judge_probe_) {  // the last probe's verification is in the estimate now: did it pay?
    judge_probe_ = false;
    probe_interval_ = best > before_probe_ ? config_.probe_interval_min
                                           : std::min(2 * probe_interval_, config_.probe_interval_max);
  }
  if (best < K) {
    // A probe adds K draft passes (not shared: the others may not draft) and K verified rows to a step of
    // S sequences; each sequence waits long enough for its probes to stay within probe_budget / S of the
    // time (on this CPU, where three draft passes cost ten plain steps, ~1000 steps for one stream; on an
    // H200 at 1.6x, ~60).
    const double step0 = cost.base() + S * cost.per_row();
    const double cost_gap =
        cost.has_steps() && step0 > 0
            ? S * K * (cost.draft_pass() + cost.per_row()) / (step0 * config_.probe_budget)
            : 0;
    if (++below_max_steps_ >= std::max<double>(probe_interval_, cost_gap)) {
      before_probe_ = best;
      best = K;
      d = DraftDecision::kProbe;
      below_max_steps_ = 0;
      probe_sent_ = true;
    }
  } else {
    below_max_steps_ = 0;
  }
  // A step without drafts keeps the cost fit's rows apart (topped up before the spread runs out).
  ++since_calibrate_;
  if (best > 0 && d != DraftDecision::kProbe && cost.has_steps() &&
      cost.row_spread() < 2 * config_.min_row_spread && since_calibrate_ >= config_.calibrate_every) {
    best = 0;
    d = DraftDecision::kCalibrate;
    since_calibrate_ = 0;
  }
  current_ = best;
  if (decision) *decision = d;
  return best;
}

}  // namespace dsmesh

// The speculation policy (draft_policy.h) and the bench's simulated acceptance (simulated_acceptance.h),
// deterministically: a simulated sequence whose drafts pass at given conditional rates, on a step whose
// cost is base + per_row x rows + draft_pass x passes, decided in the scheduler's order (the decision of
// step t sees verifications up to step t-1).
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "coordinator/draft_policy.h"
#include "coordinator/simulated_acceptance.h"

namespace dsmesh {
namespace {

struct Costs {
  double base, per_row, draft_pass;
};
// An H200-like decode step (1 x 4 rows = 1.43x one row; drafts ~4% of the step each) and a CPU-like one
// (rows cost nearly linearly).
constexpr Costs kGpu{0.0100, 0.0014, 0.0005};
constexpr Costs kCpu{0.0020, 0.0020, 0.0010};

struct SimRun {
  double tokens = 0, seconds = 0;
  int64_t steps = 0;
  std::array<int64_t, kNumDraftDecisions> decisions{};
  std::vector<int> ks;  // decisions in order
  double tok_s() const { return tokens / seconds; }
};

// `steps` decode steps of one sequence; draft i passes with conditional probability cond[i](step).
SimRun Simulate(const Costs& c, const std::function<std::vector<double>(int64_t)>& cond, int64_t steps,
             DraftPolicyConfig config = {}, uint64_t seed = 7) {
  config.max_drafts = 3;
  StepCostModel model(config);
  SequenceDraftPolicy policy(config);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  SimRun run;
  int proposed = 3;  // the first decode step verifies the drafts proposed after the prefill
  for (int64_t t = 0; t < steps; ++t) {
    DraftDecision d;
    const int k = policy.Decide(model, 1, 1, &d);
    ++run.decisions[static_cast<int>(d)];
    run.ks.push_back(k);
    const std::vector<double> p = cond(t);
    int accepted = 0;
    while (accepted < proposed && u(rng) < p[accepted]) ++accepted;
    const double fwd = c.base + c.per_row * (1 + proposed), drafting = c.draft_pass * k;
    run.tokens += 1 + accepted;
    run.seconds += fwd + drafting;
    model.Observe(1 + proposed, fwd, k, drafting);
    if (proposed > 0) policy.ObserveVerification(proposed, accepted);
    proposed = k;
  }
  run.steps = steps;
  return run;
}

std::function<std::vector<double>(int64_t)> Fixed(std::vector<double> cond) {
  return [cond](int64_t) { return cond; };
}

std::string Trace(const SimRun& r, size_t from = 0, size_t n = 400) {
  std::string t;
  for (size_t i = from; i < r.ks.size() && i < from + n; ++i) t += char('0' + r.ks[i]);
  return t;
}

int64_t Count(const SimRun& r, DraftDecision d) { return r.decisions[static_cast<int>(d)]; }

TEST(SimulatedAcceptance, ParsesNonIncreasingRatesOnePerDraft) {
  EXPECT_EQ(ParseDraftAcceptance("0.85,0.70,0.55", 3, "--draft-acceptance"), (std::vector<double>{0.85, 0.7, 0.55}));
  EXPECT_EQ(ParseDraftAcceptance("1,1,0", 3, "--x"), (std::vector<double>{1, 1, 0}));
  for (const char* bad : {"0.5,0.7,0.2", "0.9,0.8", "0.9,0.8,0.7,0.6", "1.2,0.5,0.1", "-0.1,-0.2,-0.3", "a,0.5,0.1",
                          "0.9,,0.1", "", "0.9,0.5,0.1,", "nan,0.5,0.1"})
    EXPECT_THROW(ParseDraftAcceptance(bad, 3, "--draft-acceptance"), std::invalid_argument) << bad;
  try {
    ParseDraftAcceptance("0.5,0.7,0.2", 3, "--draft-acceptance");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("non-increasing"), std::string::npos) << e.what();
  }
}

TEST(SimulatedAcceptance, PositionRatesAreTheGivenOnesAndAPrefix) {
  AcceptanceSimulator sim({0.85, 0.70, 0.55}, 3);
  const int n = 200000;
  std::array<int64_t, 3> at{};
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    const int m = sim.Draw(3);
    ASSERT_GE(m, 0);
    ASSERT_LE(m, 3);
    total += m;
    for (int p = 0; p < m; ++p) ++at[p];
  }
  EXPECT_NEAR(at[0] / double(n), 0.85, 0.005);
  EXPECT_NEAR(at[1] / double(n), 0.70, 0.005);
  EXPECT_NEAR(at[2] / double(n), 0.55, 0.005);
  EXPECT_NEAR(1 + total / double(n), 1 + 0.85 + 0.70 + 0.55, 0.01);
  EXPECT_LE(sim.Draw(1), 1);  // never more than proposed
  AcceptanceSimulator a({0.5, 0.5, 0.5}, 9), b({0.5, 0.5, 0.5}, 9);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.Draw(3), b.Draw(3));  // seeded: the same every run
}

TEST(StepCostModel, FitsBaseAndPerRowOnceRowsSpread) {
  DraftPolicyConfig config;
  StepCostModel m(config);
  EXPECT_FALSE(m.has_steps());
  for (int i = 0; i < 50; ++i) m.Observe(4, 0.010 + 0.002 * 4, 3, 0.003);
  EXPECT_FALSE(m.rows_fitted());  // every step had 4 rows: the slope is unknown, so all of it counts as rows
  EXPECT_NEAR(m.per_row(), 0.018 / 4, 1e-9);
  EXPECT_NEAR(m.base(), 0.0, 1e-8);
  EXPECT_NEAR(m.draft_pass(), 0.001, 1e-9);
  for (int i = 0; i < 50; ++i) m.Observe(i % 2 ? 1 : 4, 0.010 + 0.002 * (i % 2 ? 1 : 4), 0, 0);
  EXPECT_TRUE(m.rows_fitted());
  EXPECT_NEAR(m.per_row(), 0.002, 1e-6);
  EXPECT_NEAR(m.base(), 0.010, 1e-6);
  EXPECT_NEAR(m.draft_pass(), 0.001, 1e-9);  // steps without drafts leave it alone
}

TEST(SequenceDraftPolicy, HighAcceptanceKeepsEveryDraftWhereVerificationIsCheap) {
  const SimRun r = Simulate(kGpu, Fixed({0.85, 0.82, 0.79}), 400);  // unconditional 0.85, 0.70, 0.55
  // Full almost always; a step without drafts now and then measures the step they are weighed against.
  EXPECT_GT(Count(r, DraftDecision::kFull), 360);
  EXPECT_GT(Count(r, DraftDecision::kCalibrate), 0);
  EXPECT_LE(Count(r, DraftDecision::kCalibrate), 400 / DraftPolicyConfig{}.calibrate_every + 1);
  EXPECT_EQ(Count(r, DraftDecision::kProbe), 0);
  // Off only at the start, while the rows have not spread and the whole step counts as rows.
  EXPECT_LE(Count(r, DraftDecision::kOff), 3);
  for (size_t t = 10; t < r.ks.size(); ++t) EXPECT_NE(r.ks[t], 1) << t;
  EXPECT_GT(r.tokens / r.steps, 2.9);
}

TEST(SequenceDraftPolicy, LowAcceptanceTurnsDraftsOffAndProbesBackingOff) {
  // Unconditional 0.3, 0.1, 0.0 where rows cost nearly linearly: no draft pays.
  const SimRun r = Simulate(kCpu, Fixed({0.3, 0.33, 0.0}), 2000);
  EXPECT_GT(Count(r, DraftDecision::kOff), 1900);
  EXPECT_EQ(r.ks[1900], 0);
  // Probes back off: 8, 16, 32, ... up to 256 steps apart while they do not pay.
  const int64_t probes = Count(r, DraftDecision::kProbe);
  EXPECT_GE(probes, 5);
  EXPECT_LE(probes, 16);
  int64_t last = -1, widest = 0;
  for (size_t t = 20; t < r.ks.size(); ++t)
    if (r.ks[t] == 3) {
      if (last >= 0) widest = std::max<int64_t>(widest, static_cast<int64_t>(t) - last);
      last = static_cast<int64_t>(t);
    }
  EXPECT_EQ(widest, DraftPolicyConfig{}.probe_interval_max) << Trace(r, 0, 2000);
  // Speculation never costs speed: at least 95% of the same steps without drafts.
  const double off_tok_s = 1.0 / (kCpu.base + kCpu.per_row);
  EXPECT_GE(r.tok_s(), 0.95 * off_tok_s) << r.tok_s() << " vs " << off_tok_s;
}

TEST(SequenceDraftPolicy, LowAcceptanceKeepsTheDraftThatStillPaysOnCheapRows) {
  // The same acceptance where a verified row costs 14% of the step: one draft at 0.3 still pays.
  const SimRun r = Simulate(kGpu, Fixed({0.3, 0.33, 0.0}), 1000);
  EXPECT_GT(Count(r, DraftDecision::kReduced), 800) << Trace(r);
  const double off_tok_s = 1.0 / (kGpu.base + kGpu.per_row);
  EXPECT_GT(r.tok_s(), off_tok_s);
}

TEST(SequenceDraftPolicy, CpuLikeStepsNeverLoseToNoSpeculation) {
  const double off_tok_s = 1.0 / (kCpu.base + kCpu.per_row);
  for (const std::vector<double>& cond :
       {std::vector<double>{0.3, 0.33, 0.0}, std::vector<double>{0.6, 0.5, 0.4}, std::vector<double>{0.0, 0.0, 0.0}}) {
    const SimRun r = Simulate(kCpu, Fixed(cond), 2000);
    EXPECT_GE(r.tok_s(), 0.95 * off_tok_s) << cond[0] << "," << cond[1] << "," << cond[2];
  }
  // Where every draft passes, three drafts pay even on rows that cost nearly linearly.
  const SimRun all = Simulate(kCpu, Fixed({1, 1, 1}), 500);
  EXPECT_GT(Count(all, DraftDecision::kFull), 450);
  EXPECT_GT(all.tok_s(), 1.15 * off_tok_s);
}

TEST(SequenceDraftPolicy, OnlyTheDraftsThatPayAreProposed) {
  // Position 0 passes 90%, position 1 never: one draft pays, more do not.
  const SimRun r = Simulate(kGpu, Fixed({0.9, 0.0, 0.0}), 600);
  EXPECT_GT(Count(r, DraftDecision::kReduced), 500);
  int ones = 0;
  for (size_t t = 100; t < r.ks.size(); ++t) ones += r.ks[t] == 1;
  EXPECT_GT(ones, 450) << Trace(r);
}

TEST(SequenceDraftPolicy, RecoversThroughAProbeWhenTextBecomesPredictable) {
  // Nothing passes for 300 steps, then everything does.
  const SimRun r = Simulate(kGpu, [](int64_t t) { return t < 300 ? std::vector<double>{0, 0, 0} : std::vector<double>{1, 1, 1}; },
                         700);
  EXPECT_EQ(r.ks[299], 0);
  int64_t back = -1;
  for (size_t t = 300; t < r.ks.size() && back < 0; ++t)
    if (r.ks[t] == 3 && t + 2 < r.ks.size() && r.ks[t + 2] == 3) back = static_cast<int64_t>(t);
  ASSERT_GE(back, 300);
  EXPECT_LE(back, 300 + 256 + 2) << "the next probe finds the drafts passing and speculation stays on";
  for (size_t t = back + 2; t < r.ks.size(); ++t)
    ASSERT_TRUE(r.ks[t] == 3 || r.ks[t] == 0) << t;  // full, but for calibration steps
}

TEST(SequenceDraftPolicy, StartsOptimisticAndIsDeterministic) {
  DraftPolicyConfig config;
  config.max_drafts = 3;
  StepCostModel none(config);
  SequenceDraftPolicy p(config);
  DraftDecision d;
  EXPECT_EQ(p.Decide(none, 1, 1, &d), 3);  // no measurement yet: speculate, as vLLM always does
  EXPECT_EQ(d, DraftDecision::kFull);
  EXPECT_DOUBLE_EQ(p.ExpectedTokens(3), 4.0);
  p.ObserveVerification(3, 1);  // position 0 passed, position 1 failed, position 2 not judged
  EXPECT_GT(p.acceptance(0), p.acceptance(1));
  EXPECT_DOUBLE_EQ(p.acceptance(2), 1.0);
  const SimRun a = Simulate(kCpu, Fixed({0.5, 0.5, 0.5}), 300), b = Simulate(kCpu, Fixed({0.5, 0.5, 0.5}), 300);
  EXPECT_EQ(a.ks, b.ks);
}

}  // namespace
}  // namespace dsmesh

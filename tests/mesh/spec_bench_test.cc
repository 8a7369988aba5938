// `dsmesh bench --speculative-config ... --draft-acceptance R0,R1,R2` on the CPU, tiny model with one MTP
// block: over 400+ verification steps the measured mean accepted length is within 5% of 1 + the sum of the
// rates and each position's rate is near its own; speculation off is measured in the same call; the JSON
// carries both shapes; --repeat alternates which mesh runs first and reports every run; rates that increase
// are a usage error. (The adaptive draft policy's own tests:
// coordinator/draft_policy_test.cc.)
#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/mesh/mesh_fixture.h"

namespace dsmesh::mesh_test {
namespace {

const char kSpec[] = "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'";

TEST(SpecBench, SimulatedAcceptanceMatchesTheRatesBesideSpeculationOff) {
  const std::string json = TempDir("spec_bench") + "/bench.json";
  int rc = 0;
  // One stream of 1400 tokens: about 450 verification steps at 3.1 tokens each. --draft-policy fixed: on
  // this CPU a draft pass costs several plain steps, so the adaptive policy (rightly) proposes none.
  const std::string out =
      Capture(Runfile("cli/dsmesh") + " bench --world 1 --threads 1 --kv-memory 64M --model " + TinyModelDir() +
                  " --streams 1 --prompt-tokens 16 --max-tokens 1400 --max-model-len 2048 " + kSpec +
                  " --draft-acceptance 0.85,0.70,0.55 --draft-policy fixed --json " + json + " 2>&1",
              &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SIMULATED ACCEPTANCE"), std::string::npos) << out;
  EXPECT_NE(out.find("speculation on / off"), std::string::npos) << out;
  std::ifstream in(json);
  const nlohmann::json rows = nlohmann::json::parse(in);
  ASSERT_EQ(rows.size(), 2u) << rows.dump(2);
  const nlohmann::json& on = rows[0];
  const nlohmann::json& off = rows[1];
  EXPECT_EQ(on["speculation"], "mtp");
  EXPECT_EQ(on["acceptance"], "simulated acceptance");
  EXPECT_EQ(on["draft_policy"], "fixed");
  EXPECT_EQ(off["speculation"], "off");
  EXPECT_EQ(off["mean_accepted_length"].get<double>(), 1.0);
  EXPECT_GT(off["tok_per_s"].get<double>(), 0);
  ASSERT_GE(on["verification_steps"].get<int64_t>(), 400) << on.dump(2);
  const double want = 1 + 0.85 + 0.70 + 0.55;
  EXPECT_NEAR(on["mean_accepted_length"].get<double>(), want, 0.05 * want) << on.dump(2);
  const std::vector<double> rates = on["acceptance_per_position"];
  ASSERT_EQ(rates.size(), 3u);
  EXPECT_NEAR(rates[0], 0.85, 0.06) << on.dump(2);
  EXPECT_NEAR(rates[1], 0.70, 0.06) << on.dump(2);
  EXPECT_NEAR(rates[2], 0.55, 0.06) << on.dump(2);
  // Tokens per step follow: the off shape makes one per step.
  EXPECT_NEAR(off["tokens_per_step_per_stream"].get<double>(), 1.0, 0.02);
  EXPECT_GT(on["tokens_per_step_per_stream"].get<double>(), 2.5);
}

// --repeat 3: the two meshes alternate which runs first (on off, off on, on off), every run is printed
// and kept in the JSON, and the median run sits between the slowest and the fastest (kept as tok_per_s).
TEST(SpecBench, RepeatsAlternateTheFirstMeshAndReportEveryRun) {
  const std::string json = TempDir("spec_bench_repeat") + "/bench.json";
  int rc = 0;
  const std::string out =
      Capture(Runfile("cli/dsmesh") + " bench --world 1 --threads 1 --kv-memory 64M --model " + TinyModelDir() +
                  " --streams 1 --prompt-tokens 8 --max-tokens 24 --repeat 3 " + kSpec +
                  " --draft-acceptance 0.3,0.1,0.0 --json " + json + " 2>&1",
              &rc);
  ASSERT_EQ(rc, 0) << out;
  const size_t first_on = out.find("run 1/3, streams 1, speculation on");
  const size_t first_off = out.find("run 1/3, streams 1, speculation off");
  const size_t second_off = out.find("run 2/3, streams 1, speculation off");
  const size_t second_on = out.find("run 2/3, streams 1, speculation on");
  const size_t third_on = out.find("run 3/3, streams 1, speculation on");
  ASSERT_NE(third_on, std::string::npos) << out;
  EXPECT_LT(first_on, first_off) << out;
  EXPECT_LT(first_off, second_off) << out;
  EXPECT_LT(second_off, second_on) << out;
  EXPECT_LT(second_on, third_on) << out;
  EXPECT_NE(out.find("median runs"), std::string::npos) << out;
  std::ifstream in(json);
  const nlohmann::json rows = nlohmann::json::parse(in);
  ASSERT_EQ(rows.size(), 2u) << rows.dump(2);
  for (const nlohmann::json& row : rows) {
    const std::vector<double> runs = row["tok_per_s_runs"];
    ASSERT_EQ(runs.size(), 3u) << row.dump(2);
    const double median = row["tok_per_s_median"].get<double>();
    EXPECT_GE(median, *std::min_element(runs.begin(), runs.end())) << row.dump(2);
    EXPECT_LE(median, row["tok_per_s"].get<double>()) << row.dump(2);
    EXPECT_DOUBLE_EQ(row["tok_per_s"].get<double>(), *std::max_element(runs.begin(), runs.end())) << row.dump(2);
  }
}

TEST(SpecBench, RatesThatIncreaseOrDoNotMatchTheDraftsAreUsageErrors) {
  int rc = 0;
  const std::string base = Runfile("cli/dsmesh") + " bench --world 1 --kv-memory 64M --model " + TinyModelDir() + " ";
  std::string out = Capture(base + kSpec + " --draft-acceptance 0.5,0.7,0.2 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("non-increasing"), std::string::npos) << out;
  out = Capture(base + kSpec + " --draft-acceptance 0.9,0.8 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("2 rate(s) for 3 draft(s)"), std::string::npos) << out;
  out = Capture(base + "--draft-acceptance 0.9,0.8,0.7 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("needs --speculative-config"), std::string::npos) << out;
}

}  // namespace
}  // namespace dsmesh::mesh_test

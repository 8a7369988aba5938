// The printing and JSON of cli/bench/step_profile.h on made-up profiles (the numbers worked out by hand), and
// the graph trace on a backend that records no graphs.
#include "cli/bench/step_profile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cli/bench/printed.h"
#include "kernels/cpu/cpu_backend.h"

namespace dsmesh {
namespace {

OpProfile TwoSteps() {
  OpProfile p;
  p.steps = 2;
  p.peak_bytes_per_s = 4.0e12;
  p.peak_source = "a test peak";
  // 2 calls per step of 10 MB each in 10 us each: 1000 GB/s, 25 % of 4 TB/s.
  p.ops.push_back({"ffn / Linear w2 [exl3 K6]", 4, 0.040, 0.1, 4 * 10e6});
  // An op with no bytes counted.
  p.ops.push_back({"attn / Attention", 2, 0.010, 0.05, 0});
  // 1 call per step of 1 MB in 100 us: 10 GB/s.
  p.ops.push_back({"Embedding", 2, 0.200, 0.02, 2 * 1e6});
  return p;
}

TEST(StepProfile, OpBytesTableAndJson) {
  const OpProfile p = TwoSteps();
  nlohmann::json j;
  const std::string text = Printed([&](std::FILE* f) { j = PrintOpBytes(p, f); });
  EXPECT_NE(text.find("a test peak"), std::string::npos) << text;
  EXPECT_NE(text.find("4.00 TB/s"), std::string::npos) << text;
  ASSERT_EQ(j["ops"].size(), 3u);
  // Largest time first: Embedding (0.2 ms), then the linear, then attention.
  EXPECT_EQ(j["ops"][0]["op"], "Embedding");
  EXPECT_DOUBLE_EQ(j["ops"][0]["gb_per_s"].get<double>(), 10.0);
  const nlohmann::json& lin = j["ops"][1];
  EXPECT_EQ(lin["op"], "ffn / Linear w2 [exl3 K6]");
  EXPECT_DOUBLE_EQ(lin["calls_per_step"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(lin["bytes_per_call"].get<double>(), 10e6);
  EXPECT_DOUBLE_EQ(lin["bytes_per_step"].get<double>(), 20e6);
  EXPECT_NEAR(lin["device_us_per_call"].get<double>(), 10.0, 1e-9);
  EXPECT_NEAR(lin["gb_per_s"].get<double>(), 1000.0, 1e-6);
  EXPECT_NEAR(lin["percent_of_peak"].get<double>(), 25.0, 1e-9);
  EXPECT_FALSE(j["ops"][2].contains("gb_per_s"));  // no bytes: no rate
  // The step's bytes are the ops' bytes summed: (40 + 2) MB over 2 steps.
  double sum = 0;
  for (const auto& o : j["ops"]) sum += o["bytes_per_step"].get<double>();
  EXPECT_DOUBLE_EQ(j["bytes_per_step"].get<double>(), sum);
  EXPECT_DOUBLE_EQ(sum, 21e6);
  EXPECT_NEAR(j["device_ms_per_step"].get<double>(), 0.125, 1e-12);
  EXPECT_NEAR(j["counted_ms_per_step"].get<double>(), 0.120, 1e-12);
  EXPECT_NE(text.find("1000.0"), std::string::npos) << text;
  EXPECT_NE(text.find("25.0%"), std::string::npos) << text;
}

TEST(StepProfile, OpBytesShowsAtMostRowsAndSumsTheRest) {
  const std::string text = Printed([&](std::FILE* f) { PrintOpBytes(TwoSteps(), f, 1); });
  EXPECT_NE(text.find("(2 more ops: 20000000 bytes, 0.025 ms per step)"), std::string::npos) << text;
}

TEST(StepProfile, AProfileWithoutOpsPrintsNothing) {
  const std::string text = Printed([&](std::FILE* f) { EXPECT_TRUE(PrintOpBytes(OpProfile{}, f).empty()); });
  EXPECT_TRUE(text.empty());
}

TEST(StepProfile, StepGraphsPerLayerAndChain) {
  StepGraphProfile g;
  GraphShape embed;
  embed.nodes = embed.kernels = embed.chain = 2;
  GraphShape layer;
  layer.nodes = 10;
  layer.kernels = 8;
  layer.memcpys = 1;
  layer.other = 1;
  layer.chain = 6;
  g.graphs.push_back({-1, 0, false, embed});
  for (int l = 0; l < 3; ++l) g.graphs.push_back({l, 1, false, layer});
  g.replays = 20;
  g.replay_ms = 1.5;
  g.chain_ms = 0.4;
  nlohmann::json j;
  const std::string text = Printed([&](std::FILE* f) { j = PrintStepGraphs(g, 2.0, f); });
  EXPECT_EQ(j["graphs"], 4);
  EXPECT_EQ(j["nodes"], 32);
  EXPECT_EQ(j["kernels"], 26);
  EXPECT_EQ(j["dependent_nodes"], 20);
  EXPECT_EQ(j["layers"], 3);
  EXPECT_DOUBLE_EQ(j["nodes_per_layer"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["dependent_nodes_per_layer"].get<double>(), 6.0);
  EXPECT_EQ(j["dependent_nodes_outside_layers"], 2);
  EXPECT_DOUBLE_EQ(j["replay_ms"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(j["chain_ms"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(j["chain_us_per_dependent_node"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(j["step_ms"].get<double>(), 2.0);
  EXPECT_NE(text.find("32 nodes (26 kernels, 3 copies, 0 sets, 3 other), 20 dependent nodes"), std::string::npos)
      << text;
  EXPECT_NE(text.find("per layer (3 layers): 10.0 nodes, 6.0 dependent"), std::string::npos) << text;
  EXPECT_NE(text.find("1.500 ms/step as recorded, 0.400 ms/step with empty kernels"), std::string::npos) << text;
}

TEST(StepProfile, NoGraphsIsSaid) {
  StepGraphProfile g;
  g.eager_segments = 7;
  nlohmann::json j;
  const std::string text = Printed([&](std::FILE* f) { j = PrintStepGraphs(g, 1.0, f); });
  EXPECT_TRUE(j.empty());
  EXPECT_NE(text.find("replayed no graph (7 segments ran eagerly)"), std::string::npos) << text;
  const std::string none = Printed([&](std::FILE* f) { PrintStepGraphs(StepGraphProfile{}, 1.0, f); });
  EXPECT_NE(none.find("none (this backend records no graphs)"), std::string::npos) << none;
}

TEST(StepProfile, TraceOnABackendWithoutGraphsRunsOneStep) {
  auto cpu = MakeCpuBackend();
  int steps = 0;
  const StepGraphProfile g = TraceDecodeGraphs(*cpu, [&] { ++steps; }, 10);
  EXPECT_EQ(steps, 1);
  EXPECT_TRUE(g.graphs.empty());
  EXPECT_EQ(g.replays, 0);
}

}  // namespace
}  // namespace dsmesh

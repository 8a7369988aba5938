// `dsmesh bench --profile`'s measurements on the CUDA backend, on a small synthetic model whose linears
// are EXL3 (experts K2 through the single-launch MoE kernel, dense K6): the graphs a decode step replays
// (nodes, chains, per layer, the same count the backend's statistics give) and their replay with empty
// kernels, and the bytes each op declares (identical in both profiling passes, the head's and the routed
// experts' worked out by hand, the step's sum equal to the ops'). Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/op_bytes.h"
#include "model/model.h"
#include "model/sequence_state.h"
#include "cli/bench/step_profile.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using namespace testing_util;

// A tiny config at sizes where the routed experts take the single-launch kernel (hidden and intermediate
// multiples of 128), its weights synthetic EXL3 generated on the GPU.
std::string SmallSyntheticSource() {
  static std::string source;
  if (!source.empty()) return source;
  const TinyModelSpec spec = SmallExl3Spec();
  const std::string dir = TempDir("gpu_profile_model");
  WriteTinyModel(dir, 7, spec);
  source = "synthetic:" + dir + ":seed=1";
  return source;
}

// One stream after a 64-token prompt, stepping one token at a time.
struct Decoder {
  std::unique_ptr<Model> model = LoadModel(SmallSyntheticSource(), ShardSpec{}, MakeCudaBackend(0));
  std::unique_ptr<SequenceState> st = model->NewState();
  int i = 0;
  Decoder() { model->Forward({{st.get(), Tokens(64, V(), 3), false}}); }
  int V() const { return static_cast<int>(model->config().vocab_size); }
  void Step() { model->Forward({{st.get(), {Tokens(1, V(), 1000 + i++)[0]}, false}}); }
  Backend& be() { return model->backend(); }
};

TEST(GpuProfile, StepGraphsCountNodesAndChainsAndReplayFasterEmptied) {
  DSMESH_REQUIRE_GPU();
  Decoder d;
  for (int k = 0; k < 3; ++k) d.Step();  // first sight eager, then captured, then replayed
  const int64_t before = CudaBackendStats(d.be()).graphs.replayed_nodes;
  d.be().TraceStepGraphs(true);
  d.Step();
  const StepGraphProfile g = d.be().TakeStepGraphs(0);
  d.be().TraceStepGraphs(false);
  ASSERT_FALSE(g.graphs.empty());
  EXPECT_EQ(g.captures, 0);
  EXPECT_EQ(g.nodes(), CudaBackendStats(d.be()).graphs.replayed_nodes - before);
  for (const StepGraph& s : g.graphs) {
    EXPECT_GT(s.shape.nodes, 0) << "layer " << s.layer << " site " << s.site;
    EXPECT_GT(s.shape.chain, 0) << "layer " << s.layer << " site " << s.site;
    EXPECT_LE(s.shape.chain, s.shape.nodes) << "layer " << s.layer << " site " << s.site;
    EXPECT_EQ(s.shape.nodes, s.shape.kernels + s.shape.memcpys + s.shape.memsets + s.shape.other);
  }
  EXPECT_GT(g.chain(), 0);
  EXPECT_LE(g.chain(), g.nodes());
  EXPECT_EQ(g.SplitByLayer().layers, d.model->config().num_layers);

  const StepGraphProfile timed = TraceDecodeGraphs(d.be(), [&] { d.Step(); }, 50);
  EXPECT_EQ(timed.replays, 50);
  EXPECT_EQ(timed.kept_nodes, 0);
  EXPECT_EQ(timed.nodes(), g.nodes());
  EXPECT_GT(timed.replay_ms, 0);
  EXPECT_GT(timed.chain_ms, 0);
  EXPECT_LT(timed.chain_ms, timed.replay_ms);
  PrintStepGraphs(timed, 0);
  d.Step();  // the model steps on after the replays
}

// The bytes of a weight of `in` x `out` from the op's name ("[BF16]", "[F32]", "[exl3 K6]", as DTypeName spells them; sizes here are
// multiples of 128, so an EXL3 part is the whole matrix); 0 for a name without a kind.
double WeightBytesFromName(const std::string& op, int64_t in, int64_t out) {
  if (op.find("[BF16]") != std::string::npos || op.find("[F16]") != std::string::npos) return 2.0 * in * out;
  if (op.find("[F32]") != std::string::npos) return 4.0 * in * out;
  const size_t k = op.find("[exl3 K");
  if (k != std::string::npos) return op_bytes::Exl3Weight(in, out, std::stoi(op.substr(k + 7)));
  return 0;
}

// Whether an op's bytes grow with the sequence's context (op names are "phase / op", model/forward.cc's phases).
bool ReadsContext(const std::string& op) {
  return op.rfind("indexer + top-k / Indexer", 0) == 0 || op.rfind("attention core / Attention", 0) == 0;
}

TEST(GpuProfile, OpBytesAreTheSameInBothPassesAndMatchTheShapes) {
  DSMESH_REQUIRE_GPU();
  Decoder d;
  for (int k = 0; k < 2; ++k) d.Step();
  d.be().SetOpProfiling(OpProfiling::kTimeline);
  for (int k = 0; k < 2; ++k) d.Step();
  const OpProfile timeline = d.be().TakeOpProfile();
  d.be().SetOpProfiling(OpProfiling::kDeviceOnly);
  for (int k = 0; k < 2; ++k) d.Step();
  const OpProfile alone = d.be().TakeOpProfile();
  d.be().SetOpProfiling(OpProfiling::kOff);
  ASSERT_EQ(alone.steps, 2);
  ASSERT_FALSE(alone.ops.empty());
  EXPECT_GT(alone.peak_bytes_per_s, 1e11);
  EXPECT_FALSE(alone.peak_source.empty());
  std::printf("peak: %s\n", alone.peak_source.c_str());

  std::map<std::string, const OpTiming*> by_name;
  for (const OpTiming& t : timeline.ops) by_name[t.op] = &t;
  const ModelConfig& c = d.model->config();
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const int top_k = c.num_experts_per_tok;
  // One routed expert at K2: gate, up [D -> I] and down [I -> D], each a 256 x 256 block range.
  const double expert = 3 * op_bytes::Exl3Weight(256, 256, 2);
  bool head = false, experts = false;
  double sum = 0;
  for (const OpTiming& t : alone.ops) {
    SCOPED_TRACE(t.op);
    ASSERT_TRUE(by_name.count(t.op));
    EXPECT_EQ(by_name[t.op]->calls, t.calls);
    // The isolated pass runs two steps later: ops that read the context (the indexer's compressed keys, the
    // attention's entries) read a little more; every other op reads the same bytes (same shapes and routing).
    if (ReadsContext(t.op)) {
      EXPECT_GE(t.bytes, by_name[t.op]->bytes);
      EXPECT_LE(t.bytes, 1.25 * by_name[t.op]->bytes);
    } else {
      EXPECT_DOUBLE_EQ(by_name[t.op]->bytes, t.bytes);
    }
    EXPECT_GE(t.bytes, 0);
    sum += t.bytes;
    if (t.op.find("Linear") != std::string::npos) EXPECT_GT(t.bytes, 0);
    const double per_call = t.bytes / t.calls;
    if (t.op.rfind("head + logits / Linear", 0) == 0) {  // the head's phase (model/forward.cc) holds one linear
      head = true;
      ASSERT_GT(WeightBytesFromName(t.op, D, V), 0);
      EXPECT_DOUBLE_EQ(per_call, WeightBytesFromName(t.op, D, V) + op_bytes::LinearActivations(1, D, V, false));
    }
    if (t.op.find("MoeExperts") != std::string::npos) {
      experts = true;
      const double act = op_bytes::MoeExpertsActivations(1, D, top_k);
      EXPECT_GE(per_call, expert + act);
      EXPECT_LE(per_call, top_k * expert + act);
    }
  }
  EXPECT_TRUE(head);
  EXPECT_TRUE(experts);
  std::FILE* f = std::tmpfile();
  const nlohmann::json j = PrintOpBytes(alone, f);
  std::fclose(f);
  EXPECT_NEAR(j["bytes_per_step"].get<double>() * 2, sum, 1e-9 * sum);
  PrintOpBytes(alone);
}

}  // namespace
}  // namespace dsmesh

// Checkpoints with several MTP blocks (mtp.0..2): draft step i comes from block i, each block keeps its own
// window, and that state is exact: the drafts do not depend on how the windows were caught up, and a
// rollback leaves them as a run that never saw the rejected tokens. A single block is reused instead.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using namespace testing_util;

constexpr int kSpec = 3;
constexpr int64_t kVocab = 512;

std::string ModelDir(int mtp_layers) {
  TinyModelSpec s = SmallSpec();  // window 8
  s.num_mtp_layers = mtp_layers;
  const std::string dir = TempDir("mtp_layers_test_" + std::to_string(mtp_layers));
  // The same seed draws the same main model and mtp.0 first, whatever follows.
  WriteTinyModel(dir, 19, s);
  return dir;
}

std::unique_ptr<Model> Load(int mtp_layers) { return LoadModel(ModelDir(mtp_layers), ShardSpec{}, MakeCpuBackend(1)); }

std::vector<int32_t> Slice(const std::vector<int32_t>& v, int64_t a, int64_t b) {
  return std::vector<int32_t>(v.begin() + a, v.begin() + b);
}

bool SameRow(const Tensor& a, const Tensor& b, int row) {
  return std::memcmp(a.as<float>() + row * kVocab, b.as<float>() + row * kVocab, kVocab * sizeof(float)) == 0;
}

TEST(MtpLayersTest, EachDraftStepUsesItsOwnBlock) {
  auto one = Load(1), three = Load(3);
  ASSERT_EQ(three->config().num_mtp_layers, 3);
  const auto seq = Tokens(61, kVocab, 4);
  auto a = one->NewState(kSpec), b = three->NewState(kSpec);
  one->Forward({{a.get(), Slice(seq, 0, 60), false}});
  three->Forward({{b.get(), Slice(seq, 0, 60), false}});
  // Fed the same drafts, so only the blocks differ.
  auto pick = [](int step, const float*) { return static_cast<int32_t>(7 + step); };
  DraftResult ra = one->Draft({{a.get(), seq[60], kSpec, pick, true}})[0];
  DraftResult rb = three->Draft({{b.get(), seq[60], kSpec, pick, true}})[0];
  EXPECT_TRUE(SameRow(ra.logits, rb.logits, 0)) << "draft 1 comes from mtp.0 in both";
  for (int s = 1; s < kSpec; ++s)
    EXPECT_GT(RelL2(rb.logits.as<float>() + s * kVocab, ra.logits.as<float>() + s * kVocab, kVocab), 0.05)
        << "draft " << s + 1 << " should come from mtp." << s;
  // More drafts than blocks: the last block is reused for the rest (needs spare rows for them).
  auto c = three->NewState(4);
  three->Forward({{c.get(), Slice(seq, 0, 60), false}});
  DraftResult rc = three->Draft({{c.get(), seq[60], 5, pick, true}})[0];
  for (int s = 0; s < kSpec; ++s) EXPECT_TRUE(SameRow(rc.logits, rb.logits, s)) << "draft " << s + 1;
}

// Block j's window is fed by block j-1's outputs, so a long prefill must reach back a window per block.
TEST(MtpLayersTest, DraftsIndependentOfCatchUpSchedule) {
  auto m = Load(3);
  const auto seq = Tokens(150, kVocab, 8);
  auto once = m->NewState(kSpec), steps = m->NewState(kSpec), chunks = m->NewState(kSpec);
  m->Forward({{once.get(), Slice(seq, 0, 140), false}});
  for (int64_t t = 0; t < 140; ++t) {
    m->Forward({{steps.get(), {seq[t]}, false}});
    if (t + 1 < 140) m->Draft({{steps.get(), seq[t + 1], t % 3 == 0 ? 3 : 0}});
  }
  for (int64_t t = 0; t < 140; t += 50) {
    m->Forward({{chunks.get(), Slice(seq, t, std::min<int64_t>(140, t + 50)), false}});
    if (t + 50 < 140) m->Draft({{chunks.get(), -1, 0}});
  }
  auto a = m->Draft({{once.get(), seq[140], kSpec, {}, true}})[0];
  auto b = m->Draft({{steps.get(), seq[140], kSpec, {}, true}})[0];
  auto c = m->Draft({{chunks.get(), seq[140], kSpec, {}, true}})[0];
  for (int s = 0; s < kSpec; ++s) {
    EXPECT_TRUE(SameRow(a.logits, b.logits, s)) << "draft " << s + 1;
    EXPECT_TRUE(SameRow(a.logits, c.logits, s)) << "draft " << s + 1;
  }
  // Batched with another sequence: the same drafts.
  auto other = m->NewState(kSpec), again = m->NewState(kSpec);
  m->Forward({{other.get(), Slice(seq, 3, 40), false}});
  m->Forward({{again.get(), Slice(seq, 0, 140), false}});
  auto batched = m->Draft({{other.get(), seq[1], 2}, {again.get(), seq[140], kSpec, {}, true}});
  for (int s = 0; s < kSpec; ++s) EXPECT_TRUE(SameRow(batched[1].logits, a.logits, s)) << "draft " << s + 1;
}

// Verify [next, d1, d2, d3], accept some, roll back: the next drafts equal those of a state that only saw
// the accepted tokens (every block's window and kept outputs back at the accepted position).
TEST(MtpLayersTest, RollbackLeavesEveryBlockExact) {
  auto m = Load(3);
  const auto seq = Tokens(120, kVocab, 6);
  int checked = 0;
  for (int64_t P = 20; P < 40; P += 3)
    for (int accepted = 0; accepted <= kSpec; ++accepted) {
      auto spec = m->NewState(kSpec), plain = m->NewState(kSpec);
      m->Forward({{spec.get(), Slice(seq, 0, P), false}});
      m->Draft({{spec.get(), seq[P], kSpec}});
      std::vector<int32_t> verify = Slice(seq, P, P + 1 + accepted);
      while (verify.size() < kSpec + 1) verify.push_back(static_cast<int32_t>((verify.back() * 7 + 3) % kVocab));
      m->Forward({{spec.get(), verify, true}});
      spec->Rollback(P + 1 + accepted);
      m->Forward({{plain.get(), Slice(seq, 0, P + 1 + accepted), false}});
      auto a = m->Draft({{spec.get(), seq[P + 1 + accepted], kSpec, {}, true}})[0];
      auto b = m->Draft({{plain.get(), seq[P + 1 + accepted], kSpec, {}, true}})[0];
      for (int s = 0; s < kSpec; ++s) EXPECT_TRUE(SameRow(a.logits, b.logits, s)) << "P " << P << " accepted " << accepted;
      ++checked;
    }
  EXPECT_EQ(checked, 28);
}

TEST(MtpLayersTest, MissingLaterBlockIsAnError) {
  TinyModelSpec s = SmallSpec();
  s.num_mtp_layers = 2;
  const std::string dir = TempDir("mtp_layers_test_missing");
  WriteTinyModel(dir, 19, s);
  // Claim a third block the checkpoint does not have.
  std::string cfg = TinyModelConfig(s).dump();
  auto j = nlohmann::ordered_json::parse(cfg);
  j["num_nextn_predict_layers"] = 3;
  j["compress_ratios"].push_back(0);
  std::ofstream(dir + "/config.json") << j.dump(2);
  try {
    LoadModel(dir, ShardSpec{}, MakeCpuBackend(1));
    FAIL() << "loaded a checkpoint without mtp.2";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("mtp.2.e_proj.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsmesh

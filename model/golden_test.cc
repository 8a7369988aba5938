// The CPU forward against transformers 5.17's DeepseekV4ForCausalLM on the committed tiny fixture
// (tests/golden/tiny_v4, made by tests/golden/make_fixture.py on the GPU machine): logits per position
// within relative L2 1e-3, the 32-token greedy continuation identical, the incremental path (prefill +
// single-token decode) matching transformers' full forward, and the compressor entries the state holds
// matching transformers' compressed KV.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/sequence_state.h"
#include "model/testing/test_util.h"

namespace dsmesh {
namespace {

using testing_util::RelL2;

std::string FixtureDir() {
  const char* root = std::getenv("DSMESH_ROOT");
  if (!root || !*root) {
    ADD_FAILURE() << "DSMESH_ROOT is not set: run through ./dsmesh test (or export DSMESH_ROOT=<repo root>)";
    return "";
  }
  return std::string(root) + "/tests/golden/tiny_v4";
}

std::vector<int32_t> Ids(const Tensor& t) {
  std::vector<int32_t> out;
  for (float v : ToFloatVector(t)) out.push_back(static_cast<int32_t>(v));
  return out;
}

class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FixtureDir();
    ASSERT_FALSE(dir_.empty());
    golden_ = SafetensorsFile::Open(dir_ + "/golden.safetensors");
    model_ = LoadModel(dir_, ShardSpec{}, MakeCpuBackend());
    prompt_ = Ids(golden_->Get("input_ids"));
    greedy_ = Ids(golden_->Get("greedy_tokens"));
  }
  int32_t Argmax(const float* p) const {
    int32_t best = 0;
    for (int64_t v = 1; v < model_->config().vocab_size; ++v)
      if (p[v] > p[best]) best = static_cast<int32_t>(v);
    return best;
  }

  std::string dir_;
  std::shared_ptr<SafetensorsFile> golden_;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> prompt_, greedy_;
};

TEST_F(GoldenTest, PromptLogitsMatchTransformers) {
  const int64_t V = model_->config().vocab_size;
  auto st = model_->NewState();
  Tensor got = model_->Forward({{st.get(), prompt_, true}})[0].logits;
  std::vector<float> want = ToFloatVector(golden_->Get("logits"));
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  double worst = 0;
  for (size_t t = 0; t < prompt_.size(); ++t) {
    double e = RelL2(got.as<float>() + t * V, want.data() + t * V, V);
    worst = std::max(worst, e);
    EXPECT_LE(e, 1e-3) << "position " << t;
  }
  std::printf("prompt logits: worst relative L2 over %zu positions = %.3g\n", prompt_.size(), worst);
}

TEST_F(GoldenTest, HiddenStateIsTheLastLayersStreams) {
  // want_hidden returns the residual streams after the last block (the MTP input), before hc_head.
  const ModelConfig& c = model_->config();
  const std::string name = "hidden_l" + std::to_string(c.num_layers - 1);
  ASSERT_TRUE(golden_->Has(name));
  std::vector<float> want = ToFloatVector(golden_->Get(name));
  auto st = model_->NewState();
  SequenceOutput out = model_->Forward({{st.get(), prompt_, true, /*want_hidden=*/true}})[0];
  const int64_t W = c.hc_mult * c.hidden_size;
  ASSERT_EQ(out.hidden.shape, (std::vector<int64_t>{(int64_t)prompt_.size(), W}));
  for (size_t t = 0; t < prompt_.size(); ++t)
    EXPECT_LE(RelL2(out.hidden.as<float>() + t * W, want.data() + t * W, W), 1e-4) << "position " << t;
}

TEST_F(GoldenTest, GreedyContinuationIsIdentical) {
  auto st = model_->NewState();
  auto out = model_->Forward({{st.get(), prompt_, false}});
  std::vector<int32_t> got = {Argmax(out[0].logits.as<float>())};
  while (got.size() < greedy_.size()) {
    out = model_->Forward({{st.get(), {got.back()}, false}});
    got.push_back(Argmax(out[0].logits.as<float>()));
  }
  EXPECT_EQ(got, greedy_);
}

TEST_F(GoldenTest, IncrementalPathMatchesTransformersFullForward) {
  // transformers: one forward over prompt + greedy tokens. Here: the prompt, then one token per step.
  const int64_t V = model_->config().vocab_size;
  std::vector<float> want = ToFloatVector(golden_->Get("logits_all"));
  std::vector<int32_t> all = prompt_;
  all.insert(all.end(), greedy_.begin(), greedy_.end());
  ASSERT_EQ(want.size(), all.size() * V);
  for (size_t prefill : {size_t{1}, size_t{13}, prompt_.size()}) {
    auto st = model_->NewState();
    auto out = model_->Forward({{st.get(), std::vector<int32_t>(all.begin(), all.begin() + prefill), true}});
    for (size_t t = 0; t < prefill; ++t)
      ASSERT_LE(RelL2(out[0].logits.as<float>() + t * V, want.data() + t * V, V), 1e-3) << "prefill row " << t;
    for (size_t t = prefill; t < all.size(); ++t) {
      out = model_->Forward({{st.get(), {all[t]}, false}});
      ASSERT_LE(RelL2(out[0].logits.as<float>(), want.data() + t * V, V), 1e-3)
          << "prefill " << prefill << ", decode position " << t;
    }
  }
}

TEST_F(GoldenTest, CompressedEntriesMatchTransformers) {
  auto st = model_->NewState();
  model_->Forward({{st.get(), prompt_, false}});
  const ModelConfig& c = model_->config();
  int checked = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    std::string name = "compressed_kv_l" + std::to_string(l);
    if (!golden_->Has(name)) continue;
    Tensor want_t = golden_->Get(name);
    std::vector<float> want = ToFloatVector(want_t);
    const CompressorState& cs = st->data().layers[l].compressor;
    const PagedRows entries = st->data().Entries(l, false);
    ASSERT_EQ(cs.num_entries, want_t.shape[0]) << name;
    for (int64_t w = 0; w < cs.num_entries; ++w) {
      const int64_t row = entries.table[w / entries.rows_per_block] * entries.rows_per_block + w % entries.rows_per_block;
      EXPECT_LE(RelL2(entries.pool->as<float>() + row * cs.dim, want.data() + w * cs.dim, cs.dim), 1e-4)
          << name << " entry " << w;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

}  // namespace
}  // namespace dsmesh

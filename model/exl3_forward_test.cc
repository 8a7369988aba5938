// EXL3 linears inside the forward: a tiny model whose chosen linears are EXL3-quantized must give the
// logits of the same model with those linears replaced by their dequantized dense weights, alone and
// tensor-parallel (the rank slices of EXL3 weights: heads, groups, intermediate dim, vocabulary rows).
#include <gtest/gtest.h>

#include <limits>
#include <thread>

#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/exl3/quantize_linear.h"
#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using namespace testing_util;

bool Quantized(const std::string& name) {
  // One of each tensor-parallel slicing: query heads (wq_b rows), output groups (wo_a rows), wo_b input
  // columns, expert intermediate rows (w1/w3) and columns (w2), vocabulary rows (head).
  for (const char* p : {"layers.1.attn.wq_b.", "layers.1.attn.wo_a.", "layers.1.attn.wo_b.", "layers.2.ffn.experts.3.",
                        "head."})
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

class Exl3ForwardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dense_dir_ = new std::string(TempDir("exl3_test_dense_src"));
    const std::string& dense_dir = *dense_dir_;
    WriteTinyModel(dense_dir, 3, SmallSpec());
    exl3_dir_ = new std::string(TempDir("exl3_test_exl3"));
    ref_dir_ = new std::string(TempDir("exl3_test_ref"));
    Checkpoint ck = Checkpoint::Open(dense_dir);
    SafetensorsWriter exl3, ref;
    int count = 0;
    for (const std::string& name : ck.names()) {
      Tensor t = ck.Get(name);
      const std::string suffix = ".weight";
      if (!Quantized(name) || t.shape.size() != 2) {
        exl3.Add(name, t);
        ref.Add(name, t);
        continue;
      }
      const std::string prefix = name.substr(0, name.size() - suffix.size());
      const int64_t out = t.shape[0], in = t.shape[1];
      std::vector<float> w = ToFloatVector(t);
      Exl3QuantOptions opt;
      opt.K = 3;
      opt.codebook = Exl3Codebook::k3Inst;
      opt.seed = count++;
      Exl3QuantizedLinear q = QuantizeExl3Linear(w.data(), out, in, opt);
      exl3.Add(prefix + ".trellis", q.trellis);
      exl3.Add(prefix + ".suh", q.suh);
      exl3.Add(prefix + ".svh", q.svh);
      // The dense reference: W (k x n, input x output) back in nn.Linear layout [out, in], f32.
      std::vector<float> full = Exl3OriginalWeightF32(q.AsWeight());
      const int64_t n_pad = q.trellis.shape[1] * 16;
      std::vector<float> dense(out * in);
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) dense[o * in + i] = full[i * n_pad + o];
      ref.Add(name, DType::kF32, {out, in}, dense.data(), dense.size() * 4);
    }
    exl3.Write(*exl3_dir_ + "/model.safetensors");
    ref.Write(*ref_dir_ + "/model.safetensors");
    for (const std::string* d : {exl3_dir_, ref_dir_}) {
      std::string cmd = "cp '" + dense_dir + "/config.json' '" + *d + "/'";
      ASSERT_EQ(std::system(cmd.c_str()), 0);
    }
  }
  static void TearDownTestSuite() {
    delete dense_dir_;
    delete exl3_dir_;
    delete ref_dir_;
  }
  static std::string *dense_dir_, *exl3_dir_, *ref_dir_;
};
std::string* Exl3ForwardTest::dense_dir_ = nullptr;
std::string* Exl3ForwardTest::exl3_dir_ = nullptr;
std::string* Exl3ForwardTest::ref_dir_ = nullptr;

Tensor FullLogits(Model& m, const std::vector<int32_t>& tokens) {
  auto st = m.NewState();
  return m.Forward({{st.get(), tokens, true}})[0].logits;
}

TEST_F(Exl3ForwardTest, MatchesDequantizedDenseModel) {
  const auto tokens = Tokens(150, 512, 21);
  auto q = LoadModel(*exl3_dir_, ShardSpec{}, MakeCpuBackend());
  auto r = LoadModel(*ref_dir_, ShardSpec{}, MakeCpuBackend());
  Tensor a = FullLogits(*q, tokens), b = FullLogits(*r, tokens);
  for (int64_t t = 0; t < 150; ++t) EXPECT_LT(RelL2(a.as<float>() + t * 512, b.as<float>() + t * 512, 512), 1e-4) << t;
  // Quantization changed the model, so the match above is not the dense weights being read by accident.
  auto original = LoadModel(*dense_dir_, ShardSpec{}, MakeCpuBackend());
  Tensor c = FullLogits(*original, tokens);
  EXPECT_GT(RelL2(a.as<float>(), c.as<float>(), a.numel()), 1e-3);
}

TEST_F(Exl3ForwardTest, TensorParallelSlicesMatch) {
  const auto tokens = Tokens(140, 512, 22);
  auto r = LoadModel(*ref_dir_, ShardSpec{}, MakeCpuBackend());
  Tensor want = FullLogits(*r, tokens);
  for (int world : {2, 4}) {
    ThreadGroup group(world);
    std::vector<Tensor> got(world);
    std::vector<std::string> errors(world);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank)
      threads.emplace_back([&, rank] {
        try {
          ThreadCommunicator comm(&group, rank, world);
          auto m = LoadModel(*exl3_dir_, ShardSpec{rank, world}, MakeCpuBackend(1), &comm);
          got[rank] = FullLogits(*m, tokens);
        } catch (const std::exception& e) {
          errors[rank] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_EQ(errors[rank], "") << "world " << world;
      for (int64_t t = 0; t < 140; ++t)
        EXPECT_LT(RelL2(got[rank].as<float>() + t * 512, want.as<float>() + t * 512, 512), 1e-4) << t;
    }
  }
}

// The drafts' head over an EXL3 head: whole 128-row decode blocks (200 ids become 256), the same logits for
// them as the full head's, -inf beyond.
TEST_F(Exl3ForwardTest, DraftHeadRowsOfAnExl3Head) {
  const auto tokens = Tokens(40, 512, 23);
  auto full = LoadModel(*exl3_dir_, ShardSpec{}, MakeCpuBackend());
  auto sub = LoadModel(*exl3_dir_, ShardSpec{}, MakeCpuBackend());
  EXPECT_EQ(sub->SetDraftVocabulary(200), 256);
  EXPECT_NE(sub->WeightsDescription().find("draft head: head rows [0, 256)"), std::string::npos);
  EXPECT_GT(sub->WeightBytes(), full->WeightBytes());
  auto a = full->NewState(2), b = sub->NewState(2);
  full->Forward({{a.get(), tokens, false}});
  sub->Forward({{b.get(), tokens, false}});
  const DraftResult f = full->Draft({{a.get(), 7, 2, {}, true}})[0];
  const DraftResult d = sub->Draft({{b.get(), 7, 2, {}, true}})[0];
  EXPECT_LT(RelL2(d.logits.as<float>(), f.logits.as<float>(), 256), 1e-6);
  for (int64_t v = 256; v < 512; ++v) EXPECT_EQ(d.logits.as<float>()[v], -std::numeric_limits<float>::infinity());
  for (int32_t t : d.tokens) EXPECT_LT(t, 256);
}

}  // namespace
}  // namespace dsmesh

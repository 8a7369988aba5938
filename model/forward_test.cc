// The forward pass against itself along every axis the serving path relies on: prefill + decode == one
// full forward (every attention kind, across window / CSA / HCA boundaries), chunked prefill, batching,
// state cloning, both tensor namings, tensor parallelism; and the errors a user can provoke.
#include <gtest/gtest.h>

#include <thread>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using namespace testing_util;

class ForwardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir("forward_test_model"));
    WriteTinyModel(*dir_, 7, SmallSpec());
  }
  static void TearDownTestSuite() { delete dir_; }

  std::unique_ptr<Model> Load() { return LoadModel(*dir_, ShardSpec{}, MakeCpuBackend()); }

  // Logits of every position of one full forward.
  Tensor Full(Model& m, const std::vector<int32_t>& tokens) {
    auto st = m.NewState();
    return m.Forward({{st.get(), tokens, true}})[0].logits;
  }

  static std::string* dir_;
};
std::string* ForwardTest::dir_ = nullptr;

constexpr double kTol = 2e-5;

TEST_F(ForwardTest, PrefillThenDecodeEqualsFullForward) {
  auto m = Load();
  const int64_t V = m->config().vocab_size;
  const auto tokens = Tokens(300, V, 1);
  Tensor full = Full(*m, tokens);
  // Prefill lengths straddling the window (8), CSA windows (4) and HCA windows (128, 256).
  for (int P : {1, 3, 7, 8, 9, 127, 128, 129, 255, 256}) {
    auto st = m->NewState();
    auto out = m->Forward({{st.get(), std::vector<int32_t>(tokens.begin(), tokens.begin() + P), false}});
    ASSERT_LT(RelMaxDiff(out[0].logits.as<float>(), full.as<float>() + (P - 1) * V, V), kTol) << "prefill " << P;
    const int end = std::min<int>(300, P + 40);
    for (int t = P; t < end; ++t) {
      out = m->Forward({{st.get(), {tokens[t]}, false}});
      ASSERT_LT(RelMaxDiff(out[0].logits.as<float>(), full.as<float>() + t * V, V), kTol)
          << "prefill " << P << " decode position " << t;
    }
    EXPECT_EQ(st->length(), end);
  }
}

TEST_F(ForwardTest, ChunkedPrefillEqualsFullForward) {
  auto m = Load();
  const int64_t V = m->config().vocab_size;
  const auto tokens = Tokens(300, V, 2);
  Tensor full = Full(*m, tokens);
  auto st = m->NewState();
  int pos = 0;
  for (int chunk : {5, 3, 17, 1, 100, 2, 130, 42}) {
    std::vector<int32_t> part(tokens.begin() + pos, tokens.begin() + pos + chunk);
    auto out = m->Forward({{st.get(), part, true}});
    for (int i = 0; i < chunk; ++i)
      ASSERT_LT(RelMaxDiff(out[0].logits.as<float>() + i * V, full.as<float>() + (pos + i) * V, V), kTol)
          << "position " << pos + i;
    pos += chunk;
  }
  ASSERT_EQ(pos, 300);
}

TEST_F(ForwardTest, BatchedEqualsSolo) {
  auto m = Load();
  const int64_t V = m->config().vocab_size;
  std::vector<std::vector<int32_t>> seqs = {Tokens(37, V, 3), Tokens(1, V, 4), Tokens(140, V, 5), Tokens(9, V, 6)};
  std::vector<Tensor> solo;
  for (auto& s : seqs) solo.push_back(Full(*m, s));
  // Step 1: prefill all but the last token of each (in one batch); step 2: the last tokens in one batch.
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<SequenceStep> batch;
  for (auto& s : seqs) {
    states.push_back(m->NewState());
    if (s.size() > 1) batch.push_back({states.back().get(), std::vector<int32_t>(s.begin(), s.end() - 1), true});
  }
  auto out = m->Forward(batch);
  size_t k = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].size() == 1) continue;
    for (size_t t = 0; t + 1 < seqs[i].size(); ++t)
      ASSERT_LT(RelMaxDiff(out[k].logits.as<float>() + t * V, solo[i].as<float>() + t * V, V), kTol);
    ++k;
  }
  batch.clear();
  for (size_t i = 0; i < seqs.size(); ++i) batch.push_back({states[i].get(), {seqs[i].back()}, false});
  out = m->Forward(batch);
  for (size_t i = 0; i < seqs.size(); ++i)
    EXPECT_LT(RelMaxDiff(out[i].logits.as<float>(), solo[i].as<float>() + (seqs[i].size() - 1) * V, V), kTol);
}

TEST_F(ForwardTest, CloneEvolvesIndependently) {
  auto m = Load();
  const int64_t V = m->config().vocab_size;
  const auto a = Tokens(150, V, 7), b = Tokens(20, V, 8);
  auto st = m->NewState();
  m->Forward({{st.get(), std::vector<int32_t>(a.begin(), a.begin() + 130), false}});
  auto snap = st->Clone();
  EXPECT_EQ(snap->length(), 130);
  EXPECT_EQ(snap->MemoryBytes(), st->MemoryBytes());
  // Original continues with a[130..], the snapshot with b: each must equal a fresh full run.
  auto out_a = m->Forward({{st.get(), std::vector<int32_t>(a.begin() + 130, a.end()), false}});
  auto out_b = m->Forward({{snap.get(), b, false}});
  std::vector<int32_t> ab(a.begin(), a.begin() + 130);
  ab.insert(ab.end(), b.begin(), b.end());
  Tensor full_a = Full(*m, a), full_b = Full(*m, ab);
  EXPECT_LT(RelMaxDiff(out_a[0].logits.as<float>(), full_a.as<float>() + 149 * V, V), kTol);
  EXPECT_LT(RelMaxDiff(out_b[0].logits.as<float>(), full_b.as<float>() + (ab.size() - 1) * V, V), kTol);
}

TEST_F(ForwardTest, CloneSharesTheBlocksNeitherWritesAgain) {
  auto m = Load();
  const int64_t V = m->config().vocab_size;
  auto st = m->NewState();
  const auto a = Tokens(620, V, 11);
  m->Forward({{st.get(), std::vector<int32_t>(a.begin(), a.begin() + 600), false}});
  const int T = m->state_pool().block_tokens();
  ASSERT_EQ(T, 256);
  auto snap = st->Clone();
  ASSERT_EQ(st->block_table().size(), 3u);
  ASSERT_EQ(snap->block_table().size(), 3u);
  EXPECT_EQ(snap->block_table()[0], st->block_table()[0]);  // tokens 0..511: shared
  EXPECT_EQ(snap->block_table()[1], st->block_table()[1]);
  EXPECT_NE(snap->block_table()[2], st->block_table()[2]);  // the open block: copied
  auto out = m->Forward({{snap.get(), std::vector<int32_t>(a.begin() + 600, a.end()), false}});
  Tensor full = Full(*m, a);
  EXPECT_LT(RelMaxDiff(out[0].logits.as<float>(), full.as<float>() + 619 * V, V), kTol);
}

TEST_F(ForwardTest, AFullStatePoolRefusesClearlyAndRecovers) {
  auto m = Load();
  const StatePool& probe = m->state_pool();
  StatePoolOptions o;
  o.slots = 2;
  o.bytes = 2 * probe.slot_bytes() + 3 * probe.block_bytes();  // 3 blocks of 256 tokens
  const StatePool& pool = m->ConfigureStatePool(o);
  EXPECT_EQ(pool.num_blocks(), 3);
  EXPECT_EQ(pool.num_slots(), 2);
  const int64_t V = m->config().vocab_size;
  auto a = m->NewState(), b = m->NewState();
  try {
    m->NewState();
    FAIL() << "a third state fit in two slots";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("slots are in use"), std::string::npos) << e.what();
  }
  m->Forward({{a.get(), Tokens(600, V, 1), false}});  // 3 blocks: the whole pool
  try {
    m->Forward({{b.get(), Tokens(10, V, 2), false}});
    FAIL() << "a fourth block came from a pool of three";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("raise --kv-memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b->length(), 0);  // nothing ran
  a.reset();                  // its blocks and slot come back
  auto c = m->NewState();
  m->Forward({{b.get(), Tokens(10, V, 2), false}});
  EXPECT_EQ(b->length(), 10);
}

TEST_F(ForwardTest, MemoryAccountingBoundsState) {
  auto m = Load();
  auto st = m->NewState();
  const int64_t L = 300;
  st->Reserve(L);
  m->Forward({{st.get(), Tokens(L, m->config().vocab_size, 9), false}});
  EXPECT_LE(st->MemoryBytes(), m->StateFixedBytes() + L * m->StateBytesPerToken() + 64 * 1024);
  EXPECT_GT(m->StateBytesPerToken(), 0u);
}

TEST_F(ForwardTest, TransformersNamingLoadsTheSameWeights) {
  TinyModelSpec spec = SmallSpec();
  spec.transformers_naming = true;
  std::string hf_dir = TempDir("forward_test_hf");
  WriteTinyModel(hf_dir, 7, spec);
  auto ds = Load();
  auto hf = LoadModel(hf_dir, ShardSpec{}, MakeCpuBackend());
  EXPECT_EQ(hf->config().compress_ratios.size(), 4u);  // no MTP in transformers' spelling
  const auto tokens = Tokens(140, 512, 10);
  Tensor a = Full(*ds, tokens), b = Full(*hf, tokens);
  EXPECT_LT(RelMaxDiff(a.as<float>(), b.as<float>(), a.numel()), 1e-6);
}

TEST_F(ForwardTest, TensorParallelMatchesSingleRank) {
  const auto tokens = Tokens(140, 512, 11);
  auto single = Load();
  Tensor want = Full(*single, tokens);
  for (int world : {2, 4}) {
    ThreadGroup group(world);
    std::vector<Tensor> got(world);
    std::vector<std::string> errors(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        try {
          ThreadCommunicator comm(&group, r, world);
          auto m = LoadModel(*dir_, ShardSpec{r, world}, MakeCpuBackend(1), &comm);
          auto st = m->NewState();
          auto st2 = m->NewState();
          // Prefill then a decode step, so the collectives run in both shapes.
          got[r] = m->Forward({{st.get(), std::vector<int32_t>(tokens.begin(), tokens.end() - 1), true}})[0].logits;
          Tensor last = m->Forward({{st.get(), {tokens.back()}, false}})[0].logits;
          Tensor full = AllocateTensor(DType::kF32, {(int64_t)tokens.size(), 512});
          std::copy(got[r].as<float>(), got[r].as<float>() + got[r].numel(), full.as<float>());
          std::copy(last.as<float>(), last.as<float>() + 512, full.as<float>() + (tokens.size() - 1) * 512);
          got[r] = full;
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(errors[r], "") << "rank " << r;
      EXPECT_LT(RelMaxDiff(got[r].as<float>(), want.as<float>(), want.numel()), 1e-4) << "rank " << r;
    }
  }
}

TEST_F(ForwardTest, ErrorsNameTheProblem) {
  auto expect_error = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([] { LoadModel("/nonexistent/model", ShardSpec{}, MakeCpuBackend()); }, "/nonexistent/model");
  auto m = Load();
  auto st = m->NewState();
  expect_error([&] { m->Forward({{st.get(), {1, 512, 3}, false}}); }, "token id 512");
  expect_error([&] { m->Forward({{st.get(), {-1}, false}}); }, "token id -1");
  EXPECT_EQ(st->length(), 0);  // rejected before any state changed
  expect_error([] { ModelConfig::FromJson(R"({"model_type": "llama", "vocab_size": 5})", "cfg.json"); },
               "unsupported model_type \"llama\"");
  expect_error([] { ModelConfig::FromJson("{not json", "cfg.json"); }, "cfg.json: not valid JSON");
  // A checkpoint missing one tensor.
  std::string bad = TempDir("forward_test_missing");
  {
    Checkpoint ck = Checkpoint::Open(*dir_);
    SafetensorsWriter w;
    for (const auto& n : ck.names())
      if (n != "layers.2.attn.compressor.wkv.weight") w.Add(n, ck.Get(n));
    w.Write(bad + "/model.safetensors");
    std::string cmd = "cp '" + *dir_ + "/config.json' '" + bad + "/'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  expect_error([&] { LoadModel(bad, ShardSpec{}, MakeCpuBackend()); }, "missing tensor \"layers.2.attn.compressor.wkv.weight\"");
  expect_error([&] { LoadModel(*dir_, ShardSpec{0, 3}, MakeCpuBackend()); }, "not divisible");
}

}  // namespace
}  // namespace dsmesh

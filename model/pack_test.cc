// The pieces that let a small model ship as a small pack, through `dsmesh quantize` (QuantizeCheckpoint)
// and the loader: an EXL3 lm head (head=6; vocabulary 1000, not a multiple of 128, so EXL3 pads the rows),
// an fp8 embedding (embed=fp8: F8_E4M3 + per-row scale), the size by tensor class, and clear errors.
// Measured bounds are printed; the EXPECTs hold them with margin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/exl3/pack_size.h"
#include "kernels/exl3/quantize_checkpoint.h"
#include "model/model.h"
#include "model/model_impl.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using namespace testing_util;
namespace fs = std::filesystem;

constexpr int64_t kVocab = 1000;

TinyModelSpec PackSpec() {
  TinyModelSpec s = SmallSpec();
  s.vocab_size = kVocab;
  return s;
}

QuantizeCheckpointSummary Quantize(const std::string& in, const std::string& out, const Exl3BitsSpec& bits) {
  QuantizeCheckpointOptions opt;
  opt.model_dir = in;
  opt.out_dir = out;
  opt.bits = bits;
  opt.progress = false;
  opt.force = true;
  return QuantizeCheckpoint(opt);
}

class PackTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    bf16_ = new std::string(TempDir("pack_test_bf16"));
    WriteTinyModel(*bf16_, 7, PackSpec());
    const std::string root = TempDir("pack_test_packs");
    head_ = new std::string(root + "/head6");
    embed_ = new std::string(root + "/embed_fp8");
    full_ = new std::string(root + "/full");
    Exl3BitsSpec head_only;
    head_only.head = 6;  // experts and dense 0: kept as stored, so only the head differs from bf16
    head_summary_ = new QuantizeCheckpointSummary(Quantize(*bf16_, *head_, head_only));
    Exl3BitsSpec embed_only;
    embed_only.embed_fp8 = true;
    embed_summary_ = new QuantizeCheckpointSummary(Quantize(*bf16_, *embed_, embed_only));
    full_summary_ = new QuantizeCheckpointSummary(
        Quantize(*bf16_, *full_, Exl3BitsSpec::Parse("experts=4,dense=6,head=6,embed=fp8")));
  }
  static std::string *bf16_, *head_, *embed_, *full_;
  static QuantizeCheckpointSummary *head_summary_, *embed_summary_, *full_summary_;
};
std::string *PackTest::bf16_, *PackTest::head_, *PackTest::embed_, *PackTest::full_;
QuantizeCheckpointSummary *PackTest::head_summary_, *PackTest::embed_summary_, *PackTest::full_summary_;

Tensor AllLogits(Model& m, const std::vector<int32_t>& tokens) {
  auto st = m.NewState();
  return m.Forward({{st.get(), tokens, true}})[0].logits;
}

// Worst per-row relative L2 difference over `rows` rows of `cols`.
double WorstRowRelL2(const Tensor& a, const Tensor& b, int64_t rows, int64_t cols) {
  double worst = 0;
  for (int64_t t = 0; t < rows; ++t) worst = std::max(worst, RelL2(a.as<float>() + t * cols, b.as<float>() + t * cols, cols));
  return worst;
}

TEST_F(PackTest, ExlHeadLoadsAndMatchesBf16) {
  const Checkpoint pack = Checkpoint::Open(*head_);
  EXPECT_FALSE(pack.Has("head.weight"));
  ASSERT_TRUE(pack.Has("head.trellis"));
  EXPECT_EQ(pack.Get("head.trellis").shape, (std::vector<int64_t>{128 / 16, 1024 / 16, 16 * 6}));  // n padded to 1024
  EXPECT_EQ(head_summary_->tensors_quantized, 1);

  auto q = LoadModel(*head_, ShardSpec{}, MakeCpuBackend());
  const ModelWeights& w = q->impl().weights();
  EXPECT_TRUE(w.head.is_exl3());
  EXPECT_EQ(w.head.out, kVocab);
  EXPECT_EQ(w.head_bits, 6);
  EXPECT_EQ(w.exl3_linears, 1);
  EXPECT_NE(q->WeightsDescription().find("head EXL3 K6"), std::string::npos) << q->WeightsDescription();

  const auto tokens = Tokens(120, kVocab, 3);
  auto r = LoadModel(*bf16_, ShardSpec{}, MakeCpuBackend());
  EXPECT_NE(r->WeightsDescription().find("head dense BF16"), std::string::npos) << r->WeightsDescription();
  const Tensor a = AllLogits(*q, tokens), b = AllLogits(*r, tokens);
  ASSERT_EQ(a.shape, (std::vector<int64_t>{120, kVocab}));
  const double whole = RelL2(a.as<float>(), b.as<float>(), a.numel()), worst = WorstRowRelL2(a, b, 120, kVocab);
  std::printf("EXL3 K6 head vs bf16: logits rel L2 %.3e overall, worst row %.3e\n", whole, worst);
  EXPECT_LT(whole, 0.02);
  EXPECT_LT(worst, 0.03);
  EXPECT_GT(whole, 1e-5);  // the head really changed (not the bf16 weight read by accident)

  // Tensor-parallel: world 2 splits the vocabulary at row 500 (inside a 128-block of the padded head).
  ThreadGroup group(2);
  std::vector<Tensor> got(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank)
    threads.emplace_back([&, rank] {
      try {
        ThreadCommunicator comm(&group, rank, 2);
        auto m = LoadModel(*head_, ShardSpec{rank, 2}, MakeCpuBackend(1), &comm);
        got[rank] = AllLogits(*m, tokens);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(errors[rank], "");
    EXPECT_LT(RelL2(got[rank].as<float>(), a.as<float>(), a.numel()), 1e-5) << rank;
  }
}

// Padding the vocabulary to 1024 rows leaves the 1000 real rows exactly those of the dequantized weight:
// the pack's logits equal a dense model whose head is the EXL3 head's own reconstruction.
TEST_F(PackTest, PaddedHeadRowsDoNotTouchRealRows) {
  const Checkpoint pack = Checkpoint::Open(*head_), src = Checkpoint::Open(*bf16_);
  const Exl3Weight hw = LoadExl3Weight(pack, "head", 64, kVocab);
  const std::vector<float> W = Exl3OriginalWeightF32(hw);  // k_padded x n_padded (input x output)
  for (int64_t o = kVocab; o < hw.n_padded(); ++o) EXPECT_EQ(hw.svh.as<uint16_t>()[o] & 0x7FFF, 0) << o;
  std::vector<float> dense(kVocab * 64);
  for (int64_t o = 0; o < kVocab; ++o)
    for (int64_t i = 0; i < 64; ++i) dense[o * 64 + i] = W[i * hw.n_padded() + o];
  const std::string ref = TempDir("pack_test_ref");
  SafetensorsWriter wr;
  for (const std::string& name : src.names())
    if (name != "head.weight") wr.Add(name, src.Get(name));
  wr.Add("head.weight", DType::kF32, {kVocab, 64}, dense.data(), dense.size() * 4);
  wr.Write(ref + "/model.safetensors");
  fs::copy_file(*bf16_ + "/config.json", ref + "/config.json");
  const auto tokens = Tokens(100, kVocab, 4);
  auto q = LoadModel(*head_, ShardSpec{}, MakeCpuBackend());
  auto r = LoadModel(ref, ShardSpec{}, MakeCpuBackend());
  const Tensor a = AllLogits(*q, tokens), b = AllLogits(*r, tokens);
  const double worst = WorstRowRelL2(a, b, 100, kVocab);
  std::printf("EXL3 head vs its own dequantized dense head: worst row rel L2 %.3e\n", worst);
  EXPECT_LT(worst, 1e-5);
}

TEST_F(PackTest, Fp8EmbeddingRoundTrip) {
  const Checkpoint pack = Checkpoint::Open(*embed_), src = Checkpoint::Open(*bf16_);
  const Tensor e = pack.Get("embed.weight"), s = pack.Get("embed.scale"), orig = src.Get("embed.weight");
  ASSERT_EQ(e.dtype, DType::kF8E4M3);
  ASSERT_EQ(e.shape, orig.shape);
  ASSERT_EQ(s.shape, (std::vector<int64_t>{kVocab, 1}));
  EXPECT_TRUE(pack.Has("head.weight"));  // nothing else changed
  EXPECT_EQ(embed_summary_->tensors_quantized, 0);

  auto q = LoadModel(*embed_, ShardSpec{}, MakeCpuBackend());
  const ModelWeights& w = q->impl().weights();
  EXPECT_NE(w.embed_storage.find("F8_E4M3"), std::string::npos) << w.embed_storage;
  ASSERT_EQ(w.embed.dtype, DType::kBF16);
  const std::vector<float> want = ToFloatVector(orig), got = ToFloatVector(w.embed);
  const int64_t D = orig.shape[1];
  double err2 = 0, ref2 = 0, worst_rel = 0;
  for (int64_t r = 0; r < kVocab; ++r) {
    const float scale = s.as<float>()[r];
    for (int64_t c = 0; c < D; ++c) {
      const float x = want[r * D + c], y = got[r * D + c];
      ASSERT_LE(std::fabs(x - y), std::max(std::fabs(x) / 16, scale * std::ldexp(1.0f, -10))) << r << "," << c;
      if (std::fabs(x) > scale * std::ldexp(1.0f, -6)) worst_rel = std::max<double>(worst_rel, std::fabs(x - y) / std::fabs(x));
      err2 += double(x - y) * (x - y);
      ref2 += double(x) * x;
    }
  }
  std::printf("fp8 embedding: table rel L2 %.3e, worst relative error of a normal value %.4f (e4m3 bound 1/16)\n",
              std::sqrt(err2 / ref2), worst_rel);

  // The loader's table is exactly the dequantized fp8: the pack's logits equal those of a bf16 checkpoint
  // holding that table.
  const std::string ref = TempDir("pack_test_embed_ref");
  SafetensorsWriter wr;
  for (const std::string& name : src.names())
    if (name != "embed.weight") wr.Add(name, src.Get(name));
  wr.Add("embed.weight", w.embed);
  wr.Write(ref + "/model.safetensors");
  fs::copy_file(*bf16_ + "/config.json", ref + "/config.json");
  const auto tokens = Tokens(120, kVocab, 5);
  auto d = LoadModel(ref, ShardSpec{}, MakeCpuBackend());
  auto r = LoadModel(*bf16_, ShardSpec{}, MakeCpuBackend());
  const Tensor a = AllLogits(*q, tokens), b = AllLogits(*r, tokens), c = AllLogits(*d, tokens);
  EXPECT_EQ(std::memcmp(a.data, c.data, a.nbytes()), 0) << "fp8 pack vs bf16 checkpoint of the dequantized table";
  // Against the bf16 model the difference is the fp8 rounding itself (2.6 % of the table), carried through a
  // random model whose top-2 routers flip on small changes: printed, not a quality figure.
  const double whole = RelL2(a.as<float>(), b.as<float>(), a.numel());
  std::printf("fp8 embedding vs bf16 (random tiny model): logits rel L2 %.3e overall, worst row %.3e\n", whole,
              WorstRowRelL2(a, b, 120, kVocab));
  EXPECT_GT(whole, 1e-5);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_TRUE(std::isfinite(a.as<float>()[i])) << i;
}

TEST_F(PackTest, Fp8EmbeddingWithoutScaleIsRefused) {
  const std::string dir = TempDir("pack_test_noscale");
  const Checkpoint pack = Checkpoint::Open(*embed_);
  SafetensorsWriter wr;
  for (const std::string& name : pack.names())
    if (name != "embed.scale") wr.Add(name, pack.Get(name));
  wr.Write(dir + "/model.safetensors");
  fs::copy_file(*embed_ + "/config.json", dir + "/config.json");
  try {
    LoadModel(dir, ShardSpec{}, MakeCpuBackend());
    ADD_FAILURE() << "loaded an fp8 embedding without its scale";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(dir + "/model.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("\"embed.weight\" is F8_E4M3"), std::string::npos) << m;
    EXPECT_NE(m.find("embed.scale"), std::string::npos) << m;
  }
}

TEST_F(PackTest, ShippingConfigRunsAndSizesAddUp) {
  auto q = LoadModel(*full_, ShardSpec{}, MakeCpuBackend());
  const ModelWeights& w = q->impl().weights();
  EXPECT_EQ(w.head_bits, 6);
  EXPECT_NE(w.embed_storage.find("F8_E4M3"), std::string::npos);
  EXPECT_GT(w.exl3_linears, w.dense_linears) << q->WeightsDescription();  // dense: routers, weights_proj, e/h_proj
  const auto tokens = Tokens(120, kVocab, 6);
  auto r = LoadModel(*bf16_, ShardSpec{}, MakeCpuBackend());
  const Tensor a = AllLogits(*q, tokens), b = AllLogits(*r, tokens);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_TRUE(std::isfinite(a.as<float>()[i])) << i;
  // Every block quantized too, on a random model: printed, not a quality figure (docs/exl3.md measures KL).
  std::printf("experts K4 + dense K6 + head K6 + fp8 embedding vs bf16 (random tiny model): logits rel L2 %.3e\n",
              RelL2(a.as<float>(), b.as<float>(), a.numel()));

  // Sizes by class: the head and embedding exactly as computed from their shapes; the classes add up to
  // the tensors written, and the files hold those plus their headers.
  const PackBytes& bytes = full_summary_->bytes;
  EXPECT_EQ(bytes.by_class[static_cast<int>(PackClass::kHead)], Exl3LinearBytes(kVocab, 64, 6));
  EXPECT_EQ(bytes.by_class[static_cast<int>(PackClass::kEmbedding)], kVocab * 64 + kVocab * 4);
  int64_t stored = 0;
  const Checkpoint pack = Checkpoint::Open(*full_);
  for (const std::string& n : pack.names()) stored += pack.Get(n).nbytes();
  EXPECT_EQ(bytes.total(), stored);
  EXPECT_GT(full_summary_->file_bytes, stored);
  EXPECT_LT(full_summary_->file_bytes, stored + (1 << 20));
  std::printf("pack size %s\n", bytes.ToString().c_str());
  for (int c = 0; c < kPackClasses; ++c) EXPECT_GT(bytes.by_class[c], 0) << PackClassName(static_cast<PackClass>(c));
  // --size-only's figures (from the plan and shapes) are the pack's.
  EXPECT_EQ(full_summary_->planned_bytes.by_class, bytes.by_class);
  QuantizeCheckpointOptions opt;
  opt.model_dir = *bf16_;
  opt.bits = Exl3BitsSpec::Parse("experts=4,dense=6,head=6,embed=fp8");
  opt.size_only = true;
  EXPECT_EQ(QuantizeCheckpoint(opt).planned_bytes.by_class, bytes.by_class);
}

// The trained model of docs/trained-model.md (42.1 M parameters: vocab 129,280 x hidden 128, 6 layers
// [0, 4, 128, 4, 128, 4] + 1 MTP, 8 experts of width 256) has these shapes; its pack with experts K4, dense
// K6, fp8 embedding and the head at K4 or K6 must fit the 40 MB target (sized from the shapes, not encoded).
TEST(TrainedModelPack, FitsTheTarget) {
  TinyModelSpec s;
  s.vocab_size = 129280;
  s.hidden_size = 128;
  s.compress_ratios = {0, 4, 128, 4, 128, 4};
  s.num_mtp_layers = 1;
  s.num_heads = 4;
  s.head_dim = 128;
  s.rope_dim = 32;
  s.q_lora_rank = 128;
  s.o_groups = 2;
  s.o_lora_rank = 128;
  s.sliding_window = 128;
  s.index_n_heads = 32;
  s.index_head_dim = 64;
  s.index_topk = 16;
  s.n_routed_experts = 8;
  s.num_experts_per_tok = 2;
  s.moe_intermediate_size = 256;
  s.num_hash_layers = 2;
  const std::string dir = TempDir("pack_test_trained_shapes");
  WriteTinyModel(dir, 1, s);
  int64_t params = 0;
  const Checkpoint ck = Checkpoint::Open(dir);
  for (const std::string& n : ck.names())
    if (n.find("tid2eid") == std::string::npos) params += ck.Get(n).numel();
  std::printf("trained-model shapes: %.2f M parameters (tid2eid tables not counted)\n", params / 1e6);
  EXPECT_NEAR(params / 1e6, 42.1, 0.1);
  for (const char* bits : {"experts=4,dense=6", "experts=4,dense=6,head=4,embed=fp8", "experts=4,dense=6,head=6,embed=fp8",
                           "experts=4,dense=6,head=6", "experts=3,dense=4,head=3,embed=fp8"}) {
    QuantizeCheckpointOptions opt;
    opt.model_dir = dir;
    opt.bits = Exl3BitsSpec::Parse(bits);
    opt.size_only = true;
    const PackBytes b = QuantizeCheckpoint(opt).planned_bytes;
    std::printf("trained-model pack %-38s %s\n", bits, b.ToString().c_str());
    if (opt.bits.embed_fp8 && opt.bits.head) {
      EXPECT_LE(b.total(), 40000000) << bits;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsmesh

// The model side of speculative decoding: exact rollback of every piece of per-sequence state (window
// rings, compressor rings and entries, indexer keys, the MTP window) at offsets around ring wrap-around
// and ratio-4 / ratio-128 window boundaries, compared bitwise with a run that never saw the rejected
// tokens; the MTP block's drafts against differently scheduled runs of itself, and at TP2 against TP1; the
// drafts' vocabulary subset (SetDraftVocabulary) at TP1 and TP2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using namespace testing_util;

constexpr int kSpec = 3;
constexpr int64_t kVocab = 512;

class SpeculationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir("speculation_test_model"));
    WriteTinyModel(*dir_, 19, SmallSpec());  // window 8, ratios {0, 4, 128, 4}, one MTP block
  }
  static void TearDownTestSuite() { delete dir_; }
  std::unique_ptr<Model> Load() { return LoadModel(*dir_, ShardSpec{}, MakeCpuBackend(1)); }
  static std::string* dir_;
};
std::string* SpeculationTest::dir_ = nullptr;

std::vector<int32_t> Slice(const std::vector<int32_t>& v, int64_t a, int64_t b) {
  return std::vector<int32_t>(v.begin() + a, v.begin() + b);
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

TEST_F(SpeculationTest, NewStateNeedsAnMtpBlockForSpeculation) {
  auto m = Load();
  EXPECT_TRUE(m->has_mtp());
  auto st = m->NewState(kSpec);
  EXPECT_EQ(st->speculative_tokens(), kSpec);
  EXPECT_LE(st->MemoryBytes(), m->StateFixedBytes(kSpec) + 64 * 1024);
  m->Forward({{st.get(), Tokens(6, kVocab, 1), false}});
  EXPECT_THROW(st->Rollback(6 - kSpec - 1), std::runtime_error);  // more than the spare rows
  EXPECT_THROW(st->Rollback(7), std::runtime_error);
  auto plain = m->NewState();
  EXPECT_THROW(m->Draft({{plain.get(), 5, 1}}), std::runtime_error);
}

// A verification step over [s_P, s_P+1 .. s_P+a, junk...] (4 rows) rolled back to P+1+a must leave the
// state bit for bit where feeding s_0..s_P+a (without speculation: ring of `window` slots) leaves it.
TEST_F(SpeculationTest, RollbackIsExactAroundEveryBoundary) {
  auto m = Load();
  const auto seq = Tokens(300, kVocab, 5);
  const auto junk = Tokens(kSpec, kVocab, 99);
  std::vector<int64_t> prefixes;
  for (int64_t p = 6; p <= 20; ++p) prefixes.push_back(p);     // ring (8 + 3 slots) wrap, ratio-4 windows
  for (int64_t p = 123; p <= 129; ++p) prefixes.push_back(p);  // first ratio-128 window
  for (int64_t p = 251; p <= 256; ++p) prefixes.push_back(p);  // second one
  int checked = 0;
  for (int64_t P : prefixes) {
    auto base = m->NewState(kSpec);
    m->Forward({{base.get(), Slice(seq, 0, P), false}});
    m->Draft({{base.get(), seq[P], kSpec}});
    for (int a = 0; a <= kSpec; ++a) {
      auto spec = base->Clone();
      std::vector<int32_t> rows = Slice(seq, P, P + 1 + a);
      for (int j = a; j < kSpec; ++j) rows.push_back(junk[j]);
      m->Forward({{spec.get(), rows, true}});
      spec->Rollback(P + 1 + a);
      ASSERT_EQ(spec->length(), P + 1 + a);

      auto ref = m->NewState(kSpec);  // never saw the junk
      m->Forward({{ref.get(), Slice(seq, 0, P), false}});
      m->Draft({{ref.get(), seq[P], kSpec}});
      m->Forward({{ref.get(), Slice(seq, P, P + 1 + a), true}});
      auto plain = m->NewState();  // no speculation at all: window-sized rings
      m->Forward({{plain.get(), Slice(seq, 0, P + 1 + a), false}});

      // Continue all three over the next 12 tokens in verification-sized steps; drafts at each step.
      for (int64_t at = P + 1 + a; at < P + 1 + a + 12; at += kSpec + 1) {
        const auto next = Slice(seq, at, at + kSpec + 1);
        auto ds = m->Draft({{spec.get(), seq[at], kSpec, {}, true}});
        auto dr = m->Draft({{ref.get(), seq[at], kSpec, {}, true}});
        ASSERT_TRUE(SameBits(ds[0].logits, dr[0].logits)) << "MTP logits, prefix " << P << " accepted " << a << " at " << at;
        ASSERT_EQ(ds[0].tokens, dr[0].tokens);
        Tensor ls = m->Forward({{spec.get(), next, true}})[0].logits;
        Tensor lr = m->Forward({{ref.get(), next, true}})[0].logits;
        Tensor lp = m->Forward({{plain.get(), next, true}})[0].logits;
        ASSERT_TRUE(SameBits(ls, lr)) << "prefix " << P << " accepted " << a << " at " << at;
        ASSERT_TRUE(SameBits(ls, lp)) << "prefix " << P << " accepted " << a << " at " << at << " (no speculation)";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

// The drafts do not depend on how the MTP window was caught up: all at once after a long prefill (the
// block only needs the last window), or one row per step.
TEST_F(SpeculationTest, DraftsIndependentOfCatchUpSchedule) {
  auto m = Load();
  const auto seq = Tokens(150, kVocab, 8);
  auto once = m->NewState(kSpec), steps = m->NewState(kSpec), chunks = m->NewState(kSpec);
  m->Forward({{once.get(), Slice(seq, 0, 140), false}});
  for (int64_t t = 0; t < 140; ++t) {
    m->Forward({{steps.get(), {seq[t]}, false}});
    if (t + 1 < 140) m->Draft({{steps.get(), seq[t + 1], t % 3 == 0 ? 2 : 0}});
  }
  for (int64_t t = 0; t < 140; t += 50) {  // prefill chunks, the MTP window caught up to length-1 in between
    m->Forward({{chunks.get(), Slice(seq, t, std::min<int64_t>(140, t + 50)), false}});
    if (t + 50 < 140) m->Draft({{chunks.get(), -1, 0}});
  }
  auto a = m->Draft({{once.get(), seq[140], kSpec, {}, true}});
  auto b = m->Draft({{steps.get(), seq[140], kSpec, {}, true}});
  auto c = m->Draft({{chunks.get(), seq[140], kSpec, {}, true}});
  ASSERT_EQ(a[0].tokens.size(), static_cast<size_t>(kSpec));
  EXPECT_TRUE(SameBits(a[0].logits, b[0].logits));
  EXPECT_TRUE(SameBits(a[0].logits, c[0].logits));
  for (int i = 0; i < kSpec; ++i) {
    const float* row = a[0].logits.as<float>() + i * kVocab;
    EXPECT_EQ(a[0].tokens[i], std::max_element(row, row + kVocab) - row) << "draft " << i;
  }
  // Batched with other sequences: the same drafts.
  auto other = m->NewState(kSpec);
  m->Forward({{other.get(), Slice(seq, 3, 40), false}});
  auto again = m->NewState(kSpec);
  m->Forward({{again.get(), Slice(seq, 0, 140), false}});
  auto batched = m->Draft({{other.get(), seq[1], 1}, {again.get(), seq[140], kSpec, {}, true}});
  EXPECT_TRUE(SameBits(batched[1].logits, a[0].logits));
  EXPECT_EQ(batched[0].tokens.size(), 1u);
}

TEST_F(SpeculationTest, TensorParallelDraftsMatchSingleRank) {
  const auto seq = Tokens(60, kVocab, 3);
  auto single = Load();
  auto st = single->NewState(kSpec);
  single->Forward({{st.get(), Slice(seq, 0, 50), false}});
  auto want = single->Draft({{st.get(), seq[50], kSpec, {}, true}})[0];
  single->Forward({{st.get(), Slice(seq, 50, 54), true}});
  st->Rollback(52);
  auto want2 = single->Draft({{st.get(), seq[52], kSpec, {}, true}})[0];
  const int world = 2;
  ThreadGroup group(world);
  std::vector<DraftResult> got(world), got2(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator comm(&group, r, world);
        auto m = LoadModel(*dir_, ShardSpec{r, world}, MakeCpuBackend(1), &comm);
        auto s = m->NewState(kSpec);
        m->Forward({{s.get(), Slice(seq, 0, 50), false}});
        got[r] = m->Draft({{s.get(), seq[50], kSpec, {}, true}})[0];
        m->Forward({{s.get(), Slice(seq, 50, 54), true}});
        s->Rollback(52);
        got2[r] = m->Draft({{s.get(), seq[52], kSpec, {}, true}})[0];
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_LT(RelMaxDiff(got[r].logits.as<float>(), want.logits.as<float>(), want.logits.numel()), 1e-4);
    EXPECT_LT(RelMaxDiff(got2[r].logits.as<float>(), want2.logits.as<float>(), want2.logits.numel()), 1e-4);
    EXPECT_EQ(got[r].tokens, got[0].tokens);  // every rank drafts the same tokens
  }
  EXPECT_EQ(got[0].tokens, want.tokens);
  EXPECT_EQ(got2[0].tokens, want2.tokens);
}

// The drafts' vocabulary: ids < kDraftVocab. This random model's argmax lies above it more often than not,
// so the subset changes drafts; the subset's logits must be the full head's for those ids.
constexpr int64_t kDraftVocab = 200;

int32_t ArgmaxOf(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

// Row `r` of a subset draft: ids >= kDraftVocab are -inf, the others finite.
void ExpectSubsetRow(const float* row, const std::string& what) {
  int finite = 0, minus_inf = 0;
  for (int64_t v = 0; v < kVocab; ++v) {
    finite += std::isfinite(row[v]) && v < kDraftVocab;
    minus_inf += row[v] == -std::numeric_limits<float>::infinity() && v >= kDraftVocab;
  }
  EXPECT_EQ(finite, kDraftVocab) << what;
  EXPECT_EQ(minus_inf, kVocab - kDraftVocab) << what;
}

TEST_F(SpeculationTest, DraftVocabularySubset) {
  const auto seq = Tokens(80, kVocab, 11);
  auto full = Load(), sub = Load();
  EXPECT_EQ(full->draft_vocab_size(), kVocab);
  const size_t bytes = full->WeightBytes();
  EXPECT_EQ(sub->SetDraftVocabulary(kDraftVocab), kDraftVocab);  // a dense head: no rounding
  EXPECT_EQ(sub->draft_vocab_size(), kDraftVocab);
  EXPECT_EQ(sub->WeightBytes(), bytes + kDraftVocab * 64 * 2);  // rows x hidden 64 x bf16
  EXPECT_NE(sub->WeightsDescription().find("draft head: head rows [0, 200) on every rank"), std::string::npos)
      << sub->WeightsDescription();
  EXPECT_THROW(sub->SetDraftVocabulary(-1), std::runtime_error);
  EXPECT_THROW(sub->SetDraftVocabulary(kVocab + 1), std::runtime_error);
  EXPECT_EQ(sub->draft_vocab_size(), kDraftVocab);  // a refused size changes nothing

  auto a = full->NewState(kSpec), b = sub->NewState(kSpec);
  full->Forward({{a.get(), Slice(seq, 0, 40), false}});
  sub->Forward({{b.get(), Slice(seq, 0, 40), false}});
  int differs = 0, steps = 0;
  for (int64_t at = 40; at < 76; ++at, ++steps) {
    const DraftResult f = full->Draft({{a.get(), seq[at], kSpec, {}, true}})[0];
    const DraftResult d = sub->Draft({{b.get(), seq[at], kSpec, {}, true}})[0];
    ASSERT_EQ(d.tokens.size(), static_cast<size_t>(kSpec));
    ASSERT_EQ(d.logits.shape, (std::vector<int64_t>{kSpec, kVocab}));
    for (int i = 0; i < kSpec; ++i) {
      const float* row = d.logits.as<float>() + i * kVocab;
      ExpectSubsetRow(row, "at " + std::to_string(at) + " draft " + std::to_string(i));
      EXPECT_LT(d.tokens[i], kDraftVocab);
      EXPECT_EQ(d.tokens[i], ArgmaxOf(row, kDraftVocab));
    }
    // Draft 1 comes from the same input either way: the full head's logits of the subset's ids.
    EXPECT_LT(RelMaxDiff(d.logits.as<float>(), f.logits.as<float>(), kDraftVocab), 1e-5) << "at " << at;
    EXPECT_EQ(d.tokens[0], ArgmaxOf(f.logits.as<float>(), kDraftVocab));
    differs += d.tokens[0] != f.tokens[0];
    full->Forward({{a.get(), {seq[at]}, false}});
    sub->Forward({{b.get(), {seq[at]}, false}});
  }
  EXPECT_GT(differs, steps / 4);  // the subset mattered (the full head's argmax was >= kDraftVocab)

  // Sampled drafts see the subset's row: the choice is among the finite ids.
  int seen = 0;
  const DraftResult s = sub->Draft({{b.get(), seq[76], 2, [&](int step, const float* row) {
                                       ExpectSubsetRow(row, "choose step " + std::to_string(step));
                                       ++seen;
                                       return static_cast<int32_t>(kDraftVocab - 1 - step);
                                     }}})[0];
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{kDraftVocab - 1, kDraftVocab - 2}));

  // The whole vocabulary again: the copy goes, drafts are the full head's.
  EXPECT_EQ(sub->SetDraftVocabulary(0), kVocab);
  EXPECT_EQ(sub->WeightBytes(), bytes);
  EXPECT_EQ(sub->WeightsDescription().find("draft head"), std::string::npos);
  full->Forward({{a.get(), {seq[76]}, false}});
  sub->Forward({{b.get(), {seq[76]}, false}});
  const DraftResult f = full->Draft({{a.get(), seq[77], kSpec, {}, true}})[0];
  const DraftResult d = sub->Draft({{b.get(), seq[77], kSpec, {}, true}})[0];
  EXPECT_TRUE(SameBits(f.logits, d.logits));
  EXPECT_EQ(sub->SetDraftVocabulary(kVocab), kVocab);  // the vocabulary's size means the whole head too
}

// Greedy drafts without their logits are picked on the backend (Backend::SampleRows: only token ids come
// back); they equal the argmax of the logits the host path returns, with the whole head and with a draft
// vocabulary, for one sequence and a batch.
TEST_F(SpeculationTest, DraftsPickedOnTheBackendEqualTheLogitsArgmax) {
  const auto seq = Tokens(90, kVocab, 21);
  for (const int64_t vocab : {int64_t{0}, int64_t{kDraftVocab}}) {
    auto m = Load();
    m->SetDraftVocabulary(vocab);
    auto a = m->NewState(kSpec), b = m->NewState(kSpec);
    m->Forward({{a.get(), Slice(seq, 0, 40), false}});
    m->Forward({{b.get(), Slice(seq, 5, 33), false}});
    int compared = 0;
    for (int64_t at = 40; at < 70; ++at) {
      const auto logits = m->Draft({{a.get(), seq[at], kSpec, {}, true}, {b.get(), seq[at - 7], 2, {}, true}});
      const auto tokens = m->Draft({{a.get(), seq[at], kSpec}, {b.get(), seq[at - 7], 2}});
      for (size_t q = 0; q < 2; ++q) {
        EXPECT_TRUE(tokens[q].logits.data == nullptr) << "logits returned unasked";
        ASSERT_EQ(tokens[q].tokens, logits[q].tokens) << "draft vocabulary " << vocab << " at " << at << " entry " << q;
        for (size_t i = 0; i < tokens[q].tokens.size(); ++i, ++compared)
          EXPECT_EQ(tokens[q].tokens[i], ArgmaxOf(logits[q].logits.as<float>() + i * kVocab, m->draft_vocab_size()));
      }
      m->Forward({{a.get(), {seq[at]}, false}, {b.get(), {seq[at - 7]}, false}});
    }
    EXPECT_EQ(compared, 30 * (kSpec + 2));
  }
}

// A checkpoint whose head is its embedding (tie_word_embeddings, no head.weight): the drafts' rows come
// from the embedding table, and equal the tied head's own logits for those ids.
TEST_F(SpeculationTest, DraftVocabularyOfATiedHead) {
  const std::string tied = TempDir("speculation_test_tied");
  Checkpoint ck = Checkpoint::Open(*dir_);
  SafetensorsWriter w;
  for (const std::string& name : ck.names())
    if (name != "head.weight") w.Add(name, ck.Get(name));
  w.Write(tied + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(*dir_ + "/config.json"));
  config["tie_word_embeddings"] = true;
  std::ofstream(tied + "/config.json") << config.dump(2);
  const auto seq = Tokens(50, kVocab, 12);
  auto full = LoadModel(tied, ShardSpec{}, MakeCpuBackend(1)), sub = LoadModel(tied, ShardSpec{}, MakeCpuBackend(1));
  EXPECT_EQ(sub->SetDraftVocabulary(kDraftVocab), kDraftVocab);
  auto a = full->NewState(kSpec), b = sub->NewState(kSpec);
  full->Forward({{a.get(), Slice(seq, 0, 40), false}});
  sub->Forward({{b.get(), Slice(seq, 0, 40), false}});
  const DraftResult f = full->Draft({{a.get(), seq[40], kSpec, {}, true}})[0];
  const DraftResult d = sub->Draft({{b.get(), seq[40], kSpec, {}, true}})[0];
  EXPECT_LT(RelMaxDiff(d.logits.as<float>(), f.logits.as<float>(), kDraftVocab), 1e-5);
  ExpectSubsetRow(d.logits.as<float>(), "tied head");
  // Not the untied model's head: the embedding really is what both read.
  auto untied = Load();
  auto c = untied->NewState(kSpec);
  untied->Forward({{c.get(), Slice(seq, 0, 40), false}});
  const DraftResult u = untied->Draft({{c.get(), seq[40], kSpec, {}, true}})[0];
  EXPECT_GT(RelMaxDiff(u.logits.as<float>(), f.logits.as<float>(), kDraftVocab), 1e-2);
}

// Counts the logits gathers (the full head's one collective; the MTP block's all-reduces go on).
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int world() const override { return inner_->world(); }
  void AllReduceSum(float* data, size_t n) override { inner_->AllReduceSum(data, n); }
  void AllGather(const float* in, size_t n, float* out) override {
    ++gathers;
    inner_->AllGather(in, n, out);
  }
  void Broadcast(void* data, size_t bytes, int root) override { inner_->Broadcast(data, bytes, root); }
  int gathers = 0;

 private:
  Communicator* inner_;
};

TEST_F(SpeculationTest, TensorParallelDraftVocabularyMatchesSingleRank) {
  const auto seq = Tokens(60, kVocab, 4);
  auto single = Load();
  single->SetDraftVocabulary(kDraftVocab);
  auto st = single->NewState(kSpec);
  single->Forward({{st.get(), Slice(seq, 0, 50), false}});
  const DraftResult want = single->Draft({{st.get(), seq[50], kSpec, {}, true}})[0];
  const int world = 2;
  ThreadGroup group(world);
  std::vector<DraftResult> got(world);
  std::vector<int> gathers(world, -1);
  std::vector<std::vector<int32_t>> picked(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator inner(&group, r, world);
        CountingCommunicator comm(&inner);
        auto m = LoadModel(*dir_, ShardSpec{r, world}, MakeCpuBackend(1), &comm);
        EXPECT_EQ(m->SetDraftVocabulary(kDraftVocab), kDraftVocab);
        auto s = m->NewState(kSpec);
        m->Forward({{s.get(), Slice(seq, 0, 50), false}});
        const int before = comm.gathers;
        got[r] = m->Draft({{s.get(), seq[50], kSpec, {}, true}})[0];
        gathers[r] = comm.gathers - before;
        // The same drafts again, picked where the logits are (each rank holds the whole draft head).
        picked[r] = m->Draft({{s.get(), seq[50], kSpec}})[0].tokens;
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(gathers[r], 0) << "rank " << r << ": the drafts' logits need no gather";
    for (int i = 0; i < kSpec; ++i) ExpectSubsetRow(got[r].logits.as<float>() + i * kVocab, "rank " + std::to_string(r));
    for (int i = 0; i < kSpec; ++i)
      EXPECT_LT(RelMaxDiff(got[r].logits.as<float>() + i * kVocab, want.logits.as<float>() + i * kVocab, kDraftVocab),
                1e-4);
    EXPECT_EQ(got[r].tokens, want.tokens) << "rank " << r;
    EXPECT_EQ(picked[r], want.tokens) << "rank " << r << ", drafts picked on the backend";
  }
}

}  // namespace
}  // namespace dsmesh

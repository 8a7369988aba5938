// The MTP block over image rows (docs/vision.md "MTP drafting over image rows"): the MTP row for position t
// is fed token t+1's input embedding, and where token t+1 was an image row that is the image embedding the
// target was fed, not the sentinel id's table row.
//
// The reference is a text-only path through the unchanged embedding lookup: a copy of the checkpoint whose
// embedding table rows 300.. are overwritten (in the safetensors file) with the picture's embeddings, fed
// the same prompt with ids 300.. where the picture's rows were and the target residuals of the run with the
// picture copied into its MTP history. Its drafts are what the MTP block computes from (X_t, image
// embedding) by the module's definition; the run with the picture must give the same logits.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/sequence_state.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using namespace testing_util;

constexpr int kSpec = 3;
constexpr int64_t kVocab = 512;
constexpr int64_t kChunk = 10;        // the first prefill chunk: text positions 0 .. 9
constexpr int64_t kImageRows = 40;    // positions 10 .. 49: one image block (longer than the window of 32)
constexpr int64_t kLength = 60;       // then text up to position 59; the drafts follow token 60
constexpr int32_t kSentinel = 500;    // the id the prompt holds at the picture's rows
constexpr int32_t kStandIn = 300;     // reference ids 300 .. 339: table rows patched to the picture's rows

TinyModelSpec VisionMtpSpec(int mtp_layers) {
  TinyModelSpec s;  // `make-tiny --vision --vocab 512 --sliding-layers 2` with MTP blocks
  s.vision = true;
  s.vocab_size = kVocab;
  s.compress_ratios = {0, 0};
  s.num_mtp_layers = mtp_layers;
  return s;
}

std::string ModelDir(int mtp_layers) {
  const std::string dir = TempDir("mtp_image_test_" + std::to_string(mtp_layers));
  WriteTinyModel(dir, 7, VisionMtpSpec(mtp_layers));
  return dir;
}

// bf16-exact floats (the table is bf16), so that a patched table row holds exactly the embedding.
std::vector<float> PictureEmbeddings(int64_t D) {
  std::vector<float> e(static_cast<size_t>(kImageRows * D));
  uint32_t x = 99;
  for (float& v : e) {
    x = x * 1664525u + 1013904223u;
    float f = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 4.0f;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits &= 0xffff0000u;
    std::memcpy(&v, &bits, 4);
  }
  return e;
}

// Overwrites rows kStandIn .. of the bf16 `embed.weight` in dir/model.safetensors with `rows` [k, D].
void PatchEmbeddingRows(const std::string& dir, const std::vector<float>& rows, int64_t D) {
  const std::string path = dir + "/model.safetensors";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << path;
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  const nlohmann::json h = nlohmann::json::parse(header);
  ASSERT_EQ(h.at("embed.weight").at("dtype"), "BF16");
  const uint64_t begin = h.at("embed.weight").at("data_offsets")[0].get<uint64_t>();
  std::vector<uint16_t> bf16(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &rows[i], 4);
    bf16[i] = static_cast<uint16_t>(bits >> 16);
  }
  f.seekp(static_cast<std::streamoff>(8 + n + begin + static_cast<uint64_t>(kStandIn) * D * 2));
  f.write(reinterpret_cast<const char*>(bf16.data()), static_cast<std::streamsize>(bf16.size() * 2));
  ASSERT_TRUE(f.good());
}

std::vector<int32_t> Slice(const std::vector<int32_t>& v, int64_t a, int64_t b) {
  return std::vector<int32_t>(v.begin() + a, v.begin() + b);
}

// Text ids below 256 (never a stand-in or the sentinel); `image_ids` at the picture's rows.
std::vector<int32_t> Prompt(bool stand_ins) {
  std::vector<int32_t> t = Tokens(kLength + 1, 256, 5);
  for (int64_t i = 0; i < kImageRows; ++i)
    t[kChunk + i] = stand_ins ? kStandIn + static_cast<int32_t>(i) : kSentinel;
  return t;
}

// The second prefill chunk (positions kChunk .. kLength-1) of the prompt with the picture.
SequenceStep ImageChunk(SequenceState* st, const std::vector<int32_t>& prompt, const std::vector<float>& embeddings,
                        int64_t D) {
  SequenceStep s;
  s.state = st;
  s.tokens = Slice(prompt, kChunk, kLength);
  for (int64_t i = 0; i < kImageRows; ++i) s.images.rows.push_back(i);
  s.images.spans.push_back({0, kImageRows - 1});
  s.images.embeddings = AllocateTensor(DType::kF32, {kImageRows, D});
  std::memcpy(s.images.embeddings.as<float>(), embeddings.data(), embeddings.size() * sizeof(float));
  return s;
}

SequenceStep TextStep(SequenceState* st, std::vector<int32_t> tokens) {
  SequenceStep s;
  s.state = st;
  s.tokens = std::move(tokens);
  return s;
}

// The MTP history's target residuals of `from` written over those of `to` (CPU tensors of one shape).
void CopyTargetResiduals(const SequenceState& from, SequenceState* to) {
  const Tensor& a = from.data().mtp.hidden;
  Tensor& b = to->data().mtp.hidden;
  ASSERT_EQ(a.shape, b.shape);
  std::memcpy(b.data, a.data, a.nbytes());
}

int32_t Pick(int step, const float*) { return static_cast<int32_t>(7 + step); }  // fixed drafts (< 256)

// Drafts after the picture prompt in two chunks (an MTP catch-up between them, with next_token unknown).
DraftResult DraftsWithPicture(Model& m, SequenceState* st, const std::vector<float>& embeddings) {
  const auto prompt = Prompt(false);
  const int64_t D = m.config().hidden_size;
  m.Forward({TextStep(st, Slice(prompt, 0, kChunk))});
  m.Draft({{st, -1, 0}});
  m.Forward({ImageChunk(st, prompt, embeddings, D)});
  return m.Draft({{st, prompt[kLength], kSpec, Pick, true}})[0];
}

// The same schedule on a text prompt (`prompt`), with the target residuals taken from `target` (a state
// that ran the picture prompt through the same chunks) before each drafting call.
DraftResult DraftsFromText(Model& m, SequenceState* st, const std::vector<int32_t>& prompt, Model& target_model,
                           const std::vector<float>& embeddings) {
  auto target = target_model.NewState(kSpec);
  const auto with_picture = Prompt(false);
  const int64_t D = m.config().hidden_size;
  target_model.Forward({TextStep(target.get(), Slice(with_picture, 0, kChunk))});
  m.Forward({TextStep(st, Slice(prompt, 0, kChunk))});
  CopyTargetResiduals(*target, st);
  m.Draft({{st, -1, 0}});
  target_model.Forward({ImageChunk(target.get(), with_picture, embeddings, D)});
  m.Forward({TextStep(st, Slice(prompt, kChunk, kLength))});
  CopyTargetResiduals(*target, st);
  return m.Draft({{st, prompt[kLength], kSpec, Pick, true}})[0];
}

class MtpImageTest : public testing::TestWithParam<int> {};

TEST_P(MtpImageTest, DraftsSeeTheImageEmbeddings) {
  const int blocks = GetParam();
  const std::string dir = ModelDir(blocks);
  auto m = LoadModel(dir, ShardSpec{}, MakeCpuBackend(1));
  const int64_t D = m->config().hidden_size;
  ASSERT_TRUE(m->config().vision.enabled());
  ASSERT_EQ(m->config().num_mtp_layers, blocks);
  const std::vector<float> picture = PictureEmbeddings(D);

  auto st = m->NewState(kSpec);
  const DraftResult got = DraftsWithPicture(*m, st.get(), picture);

  // The reference: the patched copy, the stand-in ids, the picture run's target residuals.
  const std::string ref_dir = TempDir("mtp_image_test_ref_" + std::to_string(blocks));
  ASSERT_EQ(std::system(("cp -r '" + dir + "/.' '" + ref_dir + "'").c_str()), 0);
  PatchEmbeddingRows(ref_dir, picture, D);
  auto ref = LoadModel(ref_dir, ShardSpec{}, MakeCpuBackend(1));
  auto rs = ref->NewState(kSpec);
  const DraftResult want = DraftsFromText(*ref, rs.get(), Prompt(true), *m, picture);

  // What drafting did before: the sentinel's table row at the picture's rows.
  auto os = m->NewState(kSpec);
  const DraftResult old = DraftsFromText(*m, os.get(), Prompt(false), *m, picture);

  ASSERT_EQ(got.tokens, want.tokens);
  for (int s = 0; s < kSpec; ++s) {
    const float* g = got.logits.as<float>() + s * kVocab;
    const double err = RelL2(g, want.logits.as<float>() + s * kVocab, kVocab);
    const double before = RelL2(old.logits.as<float>() + s * kVocab, want.logits.as<float>() + s * kVocab, kVocab);
    std::printf("%d MTP blocks, draft %d: rel L2 %.3g to the reference (the sentinel's row: %.3g)\n", blocks, s + 1,
                err, before);
    EXPECT_LE(err, 1e-6) << "draft " << s + 1;
    if (s == 0) EXPECT_GT(before, 1e-3) << "the picture's rows should change the first draft";
  }
}

INSTANTIATE_TEST_SUITE_P(Blocks, MtpImageTest, testing::Values(1, 2));

// A snapshot keeps the picture's rows: its drafts are bitwise those of the original.
TEST(MtpImageStateTest, CloneKeepsTheImageRows) {
  auto m = LoadModel(ModelDir(2), ShardSpec{}, MakeCpuBackend(1));
  const std::vector<float> picture = PictureEmbeddings(m->config().hidden_size);
  const auto prompt = Prompt(false);
  auto st = m->NewState(kSpec);
  m->Forward({TextStep(st.get(), Slice(prompt, 0, kChunk))});
  m->Forward({ImageChunk(st.get(), prompt, picture, m->config().hidden_size)});
  auto copy = st->Clone();
  const DraftResult a = m->Draft({{st.get(), prompt[kLength], kSpec, Pick, true}})[0];
  const DraftResult b = m->Draft({{copy.get(), prompt[kLength], kSpec, Pick, true}})[0];
  EXPECT_EQ(std::memcmp(a.logits.data, b.logits.data, a.logits.nbytes()), 0);
}

// A text prompt in the slot a picture's state used drafts bitwise as on a fresh model: the flags are the
// state's own, the stale image rows in the slot are never read. The state's bytes include the image ring.
TEST(MtpImageStateTest, TextAfterAPictureInTheSameSlot) {
  const std::string dir = ModelDir(1);
  auto m = LoadModel(dir, ShardSpec{}, MakeCpuBackend(1));
  const std::vector<float> picture = PictureEmbeddings(m->config().hidden_size);
  int slot = -1;
  {
    auto st = m->NewState(kSpec);
    EXPECT_EQ(st->MemoryBytes(), m->StateFixedBytes(kSpec));
    EXPECT_EQ(st->data().mtp.image.shape, (std::vector<int64_t>{32 + kSpec, m->config().hidden_size}));
    slot = st->data().slot;
    DraftsWithPicture(*m, st.get(), picture);
  }
  const auto text = Tokens(kLength + 1, 256, 11);
  auto again = m->NewState(kSpec);
  ASSERT_EQ(again->data().slot, slot) << "the test wants the freed slot back";
  m->Forward({TextStep(again.get(), Slice(text, 0, kLength))});
  const DraftResult a = m->Draft({{again.get(), text[kLength], kSpec, {}, true}})[0];

  auto fresh_model = LoadModel(dir, ShardSpec{}, MakeCpuBackend(1));
  auto fresh = fresh_model->NewState(kSpec);
  fresh_model->Forward({TextStep(fresh.get(), Slice(text, 0, kLength))});
  const DraftResult b = fresh_model->Draft({{fresh.get(), text[kLength], kSpec, {}, true}})[0];
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(std::memcmp(a.logits.data, b.logits.data, a.logits.nbytes()), 0);
}

}  // namespace
}  // namespace dsmesh

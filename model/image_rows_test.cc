// Image rows in the language model (issue 24; docs/vision.md "The language model's side") against an
// independent float64 torch reference (tests/golden/make_image_rows_fixture.py, fixture
// tests/golden/image_rows_v4): given input embeddings for the image block, bias_vl routing on the hash and
// routed layers, and bidirectional attention inside the span, which is longer than the sliding window.
// The weights are `dsmesh make-tiny --vision --vocab 512 --sliding-layers 2` (seed 0), written again here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using testing_util::RelL2;

struct Fixture {
  std::vector<int32_t> tokens;
  StepImageRows images;  // token indices relative to the whole prompt
  std::vector<float> logits;
};

std::string GoldenDir() {
  const char* root = std::getenv("DSMESH_ROOT");
  if (!root || !*root) throw std::runtime_error("DSMESH_ROOT is not set: run through ./dsmesh test");
  return std::string(root) + "/tests/golden/image_rows_v4/";
}

Fixture ReadFixture() {
  auto g = SafetensorsFile::Open(GoldenDir() + "golden.safetensors");
  Fixture f;
  for (float v : ToFloatVector(g->Get("tokens"))) f.tokens.push_back(static_cast<int32_t>(v));
  for (float v : ToFloatVector(g->Get("image_rows"))) f.images.rows.push_back(static_cast<int64_t>(v));
  const std::vector<float> span = ToFloatVector(g->Get("span"));
  f.images.spans.push_back({static_cast<int64_t>(span[0]), static_cast<int64_t>(span[1])});
  const Tensor e = g->Get("embeddings");
  f.images.embeddings = AllocateTensor(DType::kF32, e.shape);
  const std::vector<float> ev = ToFloatVector(e);
  std::copy(ev.begin(), ev.end(), f.images.embeddings.as<float>());
  f.logits = ToFloatVector(g->Get("logits"));
  return f;
}

std::unique_ptr<Model> TinyVisionModel() {
  static const std::string dir = [] {
    const std::string d = testing_util::TempDir("image_rows_model");
    TinyModelSpec spec;  // what `make-tiny --vision --vocab 512 --sliding-layers 2` writes
    spec.vision = true;
    spec.vocab_size = 512;
    spec.compress_ratios = {0, 0};
    spec.num_mtp_layers = 0;
    WriteTinyModel(d, 0, spec);
    return d;
  }();
  return LoadModel(dir, ShardSpec{}, MakeCpuBackend());
}

void ExpectMatches(const std::vector<float>& got, const std::vector<float>& want, int64_t first_row, int64_t V,
                   const std::string& what) {
  const int64_t rows = static_cast<int64_t>(got.size()) / V;
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got.data() + r * V;
    const float* w = want.data() + (first_row + r) * V;
    worst = std::max(worst, RelL2(g, w, V));
    EXPECT_EQ(std::max_element(g, g + V) - g, std::max_element(w, w + V) - w) << what << " row " << first_row + r;
  }
  EXPECT_LE(worst, 1e-4) << what << " (a mismatch everywhere: the tiny model's bytes changed; regenerate the "
                                    "fixture as tests/golden/make_image_rows_fixture.py says)";
  std::printf("%s: worst row rel L2 %.3g over %lld rows\n", what.c_str(), worst, static_cast<long long>(rows));
}

TEST(ImageRowsTest, OneStepMatchesReference) {
  const Fixture f = ReadFixture();
  auto model = TinyVisionModel();
  const int64_t V = model->config().vocab_size;
  auto st = model->NewState();
  SequenceStep step{st.get(), f.tokens, true};
  step.images = f.images;
  const std::vector<SequenceOutput> out = model->Forward({step});
  ExpectMatches(ToFloatVector(out[0].logits), f.logits, 0, V, "one step");
}

TEST(ImageRowsTest, TextPrefixThenImageStepMatchesReference) {
  const Fixture f = ReadFixture();
  auto model = TinyVisionModel();
  const int64_t V = model->config().vocab_size, T = static_cast<int64_t>(f.tokens.size());
  const int64_t cut = f.images.rows.front();  // the text prefix, then the block (from its pads) and the rest
  auto st = model->NewState();
  SequenceStep first{st.get(), std::vector<int32_t>(f.tokens.begin(), f.tokens.begin() + cut), true};
  ExpectMatches(ToFloatVector(model->Forward({first})[0].logits), f.logits, 0, V, "text prefix");
  SequenceStep second{st.get(), std::vector<int32_t>(f.tokens.begin() + cut, f.tokens.end()), true};
  second.images = testing_util::SliceImageRows(f.images, cut, T);
  ExpectMatches(ToFloatVector(model->Forward({second})[0].logits), f.logits, cut, V, "image step");
}

TEST(ImageRowsTest, BatchedWithATextSequence) {
  // A text sequence beside the image one: the image rows' routing and spans stay with their sequence.
  const Fixture f = ReadFixture();
  auto model = TinyVisionModel();
  const int64_t V = model->config().vocab_size;
  auto text_alone = model->NewState(), text = model->NewState(), img = model->NewState();
  const std::vector<int32_t> words = testing_util::Tokens(9, static_cast<int>(V), 7);
  const std::vector<float> alone = ToFloatVector(model->Forward({{text_alone.get(), words, true}})[0].logits);
  SequenceStep a{text.get(), words, true}, b{img.get(), f.tokens, true};
  b.images = f.images;
  const std::vector<SequenceOutput> out = model->Forward({a, b});
  const std::vector<float> got_text = ToFloatVector(out[0].logits);
  EXPECT_LE(RelL2(got_text.data(), alone.data(), static_cast<int64_t>(alone.size())), 1e-6);
  ExpectMatches(ToFloatVector(out[1].logits), f.logits, 0, V, "batched");
}

void ExpectRefused(Model& model, SequenceStep step, const std::string& needle) {
  const int64_t before = step.state->length();
  try {
    model.Forward({step});
    ADD_FAILURE() << "accepted a step that should be refused (" << needle << ")";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_EQ(step.state->length(), before) << "a refused step moved the state";
}

TEST(ImageRowsTest, BadImageRowsAreRefusedBeforeAnythingMoves) {
  const Fixture f = ReadFixture();
  auto model = TinyVisionModel();
  auto st = model->NewState();
  const int64_t span_end = f.images.spans[0].last;

  SequenceStep cut{st.get(), std::vector<int32_t>(f.tokens.begin(), f.tokens.begin() + span_end), false};
  cut.images = testing_util::SliceImageRows(f.images, 0, span_end);
  cut.images.spans = {{f.images.spans[0].first, span_end}};  // a span past the step's last token
  ExpectRefused(*model, cut, "image spans must be ascending, disjoint and inside the step");

  SequenceStep shape{st.get(), f.tokens, false};
  shape.images = f.images;
  shape.images.embeddings = AllocateTensor(DType::kF32, {3, 4});
  ExpectRefused(*model, shape, "image embeddings must be host f32");

  SequenceStep unordered{st.get(), f.tokens, false};
  unordered.images = f.images;
  std::swap(unordered.images.rows[0], unordered.images.rows[1]);
  ExpectRefused(*model, unordered, "image rows must be ascending");

  SequenceStep text_in_span{st.get(), f.tokens, false};
  text_in_span.images = f.images;
  text_in_span.images.spans = {{f.images.spans[0].first - 2, f.images.spans[0].last}};  // starts on text
  ExpectRefused(*model, text_in_span, "is not an image row");

  // A text model has no bias_vl and no tower: image rows are refused by name.
  const std::string text_dir = testing_util::TempDir("image_rows_text_model");
  TinyModelSpec spec;
  spec.vocab_size = 512;
  spec.compress_ratios = {0, 0};
  spec.num_mtp_layers = 0;
  WriteTinyModel(text_dir, 0, spec);
  auto text_model = LoadModel(text_dir, ShardSpec{}, MakeCpuBackend());
  auto ts = text_model->NewState();
  SequenceStep on_text{ts.get(), f.tokens, false};
  on_text.images = f.images;
  ExpectRefused(*text_model, on_text, "the model has no vision tower");
}

}  // namespace
}  // namespace dsmesh

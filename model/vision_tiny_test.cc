// `make-tiny --vision` end to end on the CPU: the tiny model with a vision tower loads through the normal
// loader, a picture goes through the real preprocessing, the tower and the placeholder expansion, and the
// language model's tensors are the bytes the text-only tiny model has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "common/vision/image_prompt.h"
#include "model/image_rows.h"
#include "model/model_impl.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"
#include "common/vision/vision_preprocess.h"
#include "model/vision_tower.h"
#include "model/weights.h"

namespace dsmesh {
namespace {

// A width x height picture whose channel c at (x, y) is (x (c + a) + y b + shift) mod 256.
RgbImage Gradient(int width, int height, int a, int b, int shift = 0) {
  RgbImage img;
  img.width = width;
  img.height = height;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) img.pixels.push_back(static_cast<uint8_t>((x * (c + a) + y * b + shift) % 256));
  return img;
}

// `make-tiny --vision` at a vocabulary of 1024 in a new directory `name`; *spec gets its spec.
std::string WriteTinyVisionModel(const std::string& name, TinyModelSpec* spec) {
  const std::string dir = testing_util::TempDir(name);
  spec->vocab_size = 1024;
  spec->vision = true;
  WriteTinyModel(dir, 5, *spec);
  return dir;
}

// The tower's rows of `img` on `be` (the real preprocessing, patches uploaded, RunVisionTower); *pre gets
// the preprocessed picture.
Tensor TowerRows(Backend& be, const VisionConfig& config, const VisionWeights& weights, const RgbImage& img,
                 PreprocessedImage* pre, Communicator* comm = nullptr) {
  *pre = PreprocessImage(img, config);
  const int64_t n = static_cast<int64_t>(pre->grid.vit_h) * pre->grid.vit_w;
  Tensor patches = be.Alloc(DType::kF32, {n, 3LL * config.patch_size * config.patch_size});
  be.FromHost(pre->patches.data(), &patches);
  return RunVisionTower(be, config, weights, patches, {{pre->grid.vit_h, pre->grid.vit_w}}, comm);
}

TEST(VisionTinyTest, PictureThroughTowerAndPrompt) {
  const std::string text_dir = testing_util::TempDir("tiny_text"), dir = testing_util::TempDir("tiny_vision");
  TinyModelSpec spec;
  spec.vocab_size = 1024;
  WriteTinyModel(text_dir, 5, spec);
  spec.vision = true;
  WriteTinyModel(dir, 5, spec);

  const ModelConfig config = ModelConfig::FromDirectory(dir);
  ASSERT_TRUE(config.vision.enabled());
  EXPECT_EQ(config.vision.dim, spec.vision_dim);
  const Checkpoint ckpt = Checkpoint::Open(dir), text = Checkpoint::Open(text_dir);
  for (const std::string& name : text.names()) {
    const Tensor a = text.Get(name), b = ckpt.Get(name);
    ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
    ASSERT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << name << " differs once the tower is added";
  }

  auto be = MakeCpuBackend();
  const ModelWeights w = LoadWeights(ckpt, config, MakeShardLayout(config, ShardSpec{0, 1}), *be);
  ASSERT_EQ(w.vision.blocks.size(), static_cast<size_t>(spec.vision_n_layers));

  // A 500 x 300 gradient: scaled up to min_pixels by the size rule, then patches of 14.
  PreprocessedImage pre;
  const Tensor out = TowerRows(*be, config.vision, w.vision, Gradient(500, 300, 1, 3), &pre);
  ASSERT_EQ(out.shape[0], static_cast<int64_t>(pre.grid.llm_h) * pre.grid.llm_w);
  ASSERT_EQ(out.shape[1], config.hidden_size);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out.as<float>()[i]));

  const int32_t placeholder = 7;
  const ExpandedPrompt prompt = ExpandImagePlaceholders({0, 5, placeholder, 6}, placeholder, {{pre.grid.llm_h, pre.grid.llm_w}});
  ASSERT_EQ(prompt.images.size(), 1u);
  EXPECT_EQ(prompt.images[0].embed_positions.size(), static_cast<size_t>(out.shape[0]));
  EXPECT_EQ(prompt.images[0].length + 3, static_cast<int64_t>(prompt.tokens.size()));
  EXPECT_LE(prompt.images[0].length, config.vision.max_n_token);
  std::printf("500x300 image: vit grid %dx%d, aligner grid %dx%d, block of %lld tokens\n", pre.grid.vit_h,
              pre.grid.vit_w, pre.grid.llm_h, pre.grid.llm_w, static_cast<long long>(prompt.images[0].length));
}

// The tower of a model loaded at world 2 (LoadModel's shard: half the ViT heads, SwiGLU and aligner columns
// per rank) run through the model's communicator, as worker/plan_images does: every rank gets the world-1
// rows while holding under 60% of the world-1 tower bytes (patch embedding, norms and sentinels stay whole),
// and the load line says how the tower is split.
TEST(VisionTinyTest, TowerOfAModelLoadedAtWorldTwo) {
  TinyModelSpec spec;
  const std::string dir = WriteTinyVisionModel("tiny_vision_tp", &spec);
  const RgbImage img = Gradient(120, 80, 3, 7);
  // The model's tower rows of the picture, as host floats; `description` gets the load line.
  auto rows_of = [&](Model& model, std::string* description) {
    Backend& be = model.impl().backend();
    PreprocessedImage pre;
    const Tensor rows =
        TowerRows(be, model.config().vision, model.impl().weights().vision, img, &pre, &model.impl().comm());
    std::vector<float> host(static_cast<size_t>(rows.numel()));
    be.ToHost(rows, host.data());
    *description = model.WeightsDescription();
    return host;
  };
  std::string single_description;
  auto single_model = LoadModel(dir, ShardSpec{}, MakeCpuBackend(1));
  const std::vector<float> single = rows_of(*single_model, &single_description);
  const size_t single_bytes = single_model->impl().weights().vision.bytes;
  EXPECT_NE(single_description.find("ViT heads 4 of 4, replicated; aligner replicated"), std::string::npos)
      << single_description;

  testing_util::ThreadGroup group(2);
  std::vector<std::vector<float>> got(2);
  std::vector<std::string> descriptions(2), errors(2);
  std::vector<size_t> bytes(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        testing_util::ThreadCommunicator comm(&group, r, 2);
        auto m = LoadModel(dir, ShardSpec{r, 2}, MakeCpuBackend(1), &comm);
        got[r] = rows_of(*m, &descriptions[r]);
        bytes[r] = m->impl().weights().vision.bytes;
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(got[r].size(), single.size());
    const double err = testing_util::RelL2(got[r].data(), single.data(), single.size());
    std::printf("rank %d of 2: tower rows vs world 1 rel L2 %.3g; %s\n", r, err, descriptions[r].c_str());
    EXPECT_LE(err, 1e-6) << "rank " << r;
    EXPECT_NE(descriptions[r].find("ViT heads 2 of 4, split over 2 ranks; aligner split over 2 ranks"),
              std::string::npos)
        << descriptions[r];
    EXPECT_LT(bytes[r], single_bytes * 6 / 10) << "rank " << r;
  }
}

// The worker's part: the picture's tower rows and sentinel vectors as the step's image rows, through the
// language model (bias_vl routing, span attention); a different picture changes the answer, a chunk that
// would cut the image is refused, and ImageSafeChunkEnd moves a chunk end out of the block.
TEST(VisionTinyTest, PictureThroughTheLanguageModel) {
  TinyModelSpec spec;
  const std::string dir = WriteTinyVisionModel("tiny_vision_lm", &spec);
  auto model = LoadModel(dir, ShardSpec{}, MakeCpuBackend());
  const ModelConfig& config = model->config();
  Backend& be = model->impl().backend();
  const VisionWeights& vw = model->impl().weights().vision;

  auto answer = [&](int shift) {
    PreprocessedImage pre;
    const Tensor rows = TowerRows(be, config.vision, vw, Gradient(90, 60, 2, 5, shift), &pre);
    Tensor host = AllocateTensor(DType::kF32, rows.shape);
    be.ToHost(rows, host.data);
    const int32_t placeholder = 7;
    const ExpandedPrompt prompt =
        ExpandImagePlaceholders({0, 5, placeholder, 6, 9}, placeholder, {{pre.grid.llm_h, pre.grid.llm_w}});
    const int64_t T = static_cast<int64_t>(prompt.tokens.size());
    // The sentinel ids are the real tokenizer's; this tiny vocabulary is smaller, and nothing reads the ids
    // of image rows, so any in-vocabulary id stands in for them.
    std::vector<int32_t> tokens = prompt.tokens;
    for (int32_t& t : tokens) t = t >= spec.vocab_size ? 3 : t;
    EXPECT_THROW(BuildStepImageRows(prompt, host, vw, 0, prompt.images[0].begin + 4), std::runtime_error);
    EXPECT_EQ(ImageSafeChunkEnd(prompt, prompt.images[0].begin + 4), prompt.images[0].begin);
    EXPECT_EQ(ImageSafeChunkEnd(prompt, 1), 1);
    auto st = model->NewState();
    SequenceStep step{st.get(), tokens, false};
    step.images = BuildStepImageRows(prompt, host, vw, 0, T);
    EXPECT_EQ(step.images.rows.size(), static_cast<size_t>(prompt.images[0].length));
    EXPECT_EQ(step.images.spans.size(), 1u);
    return ToFloatVector(model->Forward({step})[0].logits);
  };
  const std::vector<float> a = answer(0), b = answer(100);
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
  const double moved = testing_util::RelL2(b.data(), a.data(), static_cast<int64_t>(a.size()));
  EXPECT_GT(moved, 1e-3) << "the picture does not reach the logits";
  std::printf("another picture moves the last row's logits by rel L2 %.3g\n", moved);
}

}  // namespace
}  // namespace dsmesh

// `make-tiny --vision` end to end on the CPU: the tiny model with a vision tower loads through the normal
// loader, a picture goes through the real preprocessing, the tower and the placeholder expansion, and the
// language model's tensors are the bytes the text-only tiny model has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/image_prompt.h"
#include "model/image_rows.h"
#include "model/model_impl.h"
#include "model/test_util.h"
#include "model/tiny_model.h"
#include "model/vision_preprocess.h"
#include "model/vision_tower.h"
#include "model/weights.h"

namespace dsmesh {
namespace {

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
  RgbImage img;
  img.width = 500;
  img.height = 300;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      for (int c = 0; c < 3; ++c) img.pixels.push_back(static_cast<uint8_t>((x * (c + 1) + y * 3) % 256));
  const PreprocessedImage pre = PreprocessImage(img, config.vision);
  const int64_t n = static_cast<int64_t>(pre.grid.vit_h) * pre.grid.vit_w;
  Tensor patches = be->Alloc(DType::kF32, {n, 3LL * config.vision.patch_size * config.vision.patch_size});
  be->FromHost(pre.patches.data(), &patches);
  const Tensor out = RunVisionTower(*be, config.vision, w.vision, patches, {{pre.grid.vit_h, pre.grid.vit_w}});
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
  const std::string dir = testing_util::TempDir("tiny_vision_tp");
  TinyModelSpec spec;
  spec.vocab_size = 1024;
  spec.vision = true;
  WriteTinyModel(dir, 5, spec);
  RgbImage img;
  img.width = 120;
  img.height = 80;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      for (int c = 0; c < 3; ++c) img.pixels.push_back(static_cast<uint8_t>((x * (c + 3) + y * 7) % 256));
  // The model's tower rows of the picture, as host floats; `description` gets the load line.
  auto rows_of = [&](Model& model, std::string* description) {
    const ModelConfig& config = model.config();
    Backend& be = model.impl().backend();
    const PreprocessedImage pre = PreprocessImage(img, config.vision);
    const int64_t n = static_cast<int64_t>(pre.grid.vit_h) * pre.grid.vit_w;
    Tensor patches = be.Alloc(DType::kF32, {n, 3LL * config.vision.patch_size * config.vision.patch_size});
    be.FromHost(pre.patches.data(), &patches);
    const Tensor rows = RunVisionTower(be, config.vision, model.impl().weights().vision, patches,
                                       {{pre.grid.vit_h, pre.grid.vit_w}}, &model.impl().comm());
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
  const std::string dir = testing_util::TempDir("tiny_vision_lm");
  TinyModelSpec spec;
  spec.vocab_size = 1024;
  spec.vision = true;
  WriteTinyModel(dir, 5, spec);
  auto model = LoadModel(dir, ShardSpec{}, MakeCpuBackend());
  const ModelConfig& config = model->config();
  Backend& be = model->impl().backend();
  const VisionWeights& vw = model->impl().weights().vision;

  auto answer = [&](int shift) {
    RgbImage img;
    img.width = 90;
    img.height = 60;
    for (int y = 0; y < img.height; ++y)
      for (int x = 0; x < img.width; ++x)
        for (int c = 0; c < 3; ++c) img.pixels.push_back(static_cast<uint8_t>((x * (c + 2) + y * 5 + shift) % 256));
    const PreprocessedImage pre = PreprocessImage(img, config.vision);
    const int64_t n = static_cast<int64_t>(pre.grid.vit_h) * pre.grid.vit_w;
    Tensor patches = be.Alloc(DType::kF32, {n, 3LL * config.vision.patch_size * config.vision.patch_size});
    be.FromHost(pre.patches.data(), &patches);
    const Tensor rows = RunVisionTower(be, config.vision, vw, patches, {{pre.grid.vit_h, pre.grid.vit_w}});
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

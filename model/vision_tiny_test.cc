// `make-tiny --vision` end to end on the CPU: the tiny model with a vision tower loads through the normal
// loader, a picture goes through the real preprocessing, the tower and the placeholder expansion, and the
// language model's tensors are the bytes the text-only tiny model has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/image_prompt.h"
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

}  // namespace
}  // namespace dsmesh

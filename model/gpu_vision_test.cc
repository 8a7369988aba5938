// The image path on the CUDA backend (issue 24): the vision tower against its independent torch reference
// (tests/golden/vision_v4) and the CPU backend, and steps with image rows (given embeddings, bias_vl routing,
// span attention) against the torch reference of tests/golden/image_rows_v4 and the CPU backend, alone,
// after a text prefix, beside a text sequence, and after CUDA graphs were recorded for text steps of the
// same shapes. Every test needs a GPU: without one it skips (and fails when DSMESH_REQUIRE_GPU_TESTS=1, as
// on the GPU machine).
//
// Tolerances: the CPU backend (f32) is within rel L2 3.3e-7 of both references; the GPU runs the same f32
// arithmetic in other orders (and its dense linears accumulate in tiles), so it is held to 1e-4 of the
// references (the bound the CPU tests use) and 1e-4 of the CPU, with the same argmax on every row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gpu_test_util.h"
#include "model/config.h"
#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"
#include "model/vision_tower.h"
#include "model/weights.h"

namespace dsmesh {
namespace {

using testing_util::RelL2;

constexpr double kTol = 1e-4;

std::string Root() {
  const char* root = std::getenv("DSMESH_ROOT");
  if (!root || !*root) throw std::runtime_error("DSMESH_ROOT is not set: run through ./dsmesh test");
  return root;
}

// Worst per-row rel L2 of got [rows, V] against want rows [first_row, first_row + rows), and whether every
// row has the same argmax.
struct RowCompare {
  double worst = 0;
  bool same_argmax = true;
};
RowCompare CompareRows(const std::vector<float>& got, const std::vector<float>& want, int64_t first_row, int64_t V) {
  RowCompare c;
  const int64_t rows = static_cast<int64_t>(got.size()) / V;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got.data() + r * V;
    const float* w = want.data() + (first_row + r) * V;
    c.worst = std::max(c.worst, RelL2(g, w, V));
    c.same_argmax &= (std::max_element(g, g + V) - g) == (std::max_element(w, w + V) - w);
  }
  return c;
}

void ExpectRowsClose(const std::vector<float>& got, const std::vector<float>& want, int64_t first_row, int64_t V,
                     const std::string& what) {
  const RowCompare c = CompareRows(got, want, first_row, V);
  std::printf("%s: worst row rel L2 %.3g over %lld rows\n", what.c_str(), c.worst,
              static_cast<long long>(got.size() / V));
  EXPECT_LE(c.worst, kTol) << what;
  EXPECT_TRUE(c.same_argmax) << what << ": a row's argmax differs";
}

// ---- the tower ----

TEST(GpuVision, TowerMatchesTorchReferenceAndCpu) {
  DSMESH_REQUIRE_GPU();
  const std::string dir = Root() + "/tests/golden/vision_v4";
  const ModelConfig config = ModelConfig::FromDirectory(dir);
  const Checkpoint ckpt = Checkpoint::Open(dir);
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  std::vector<VitGrid> grids;
  const Tensor g = golden->Get("grids");
  for (int64_t i = 0; i < g.shape[0]; ++i)
    grids.push_back({static_cast<int>(g.as<int64_t>()[2 * i]), static_cast<int>(g.as<int64_t>()[2 * i + 1])});
  const Tensor patches = golden->Get("patches");

  auto cpu = MakeCpuBackend();
  const VisionWeights cw = LoadVisionWeights(ckpt, config, *cpu);
  const Tensor cpu_vit = RunVit(*cpu, config.vision, cw, patches, grids);
  const Tensor cpu_out = RunVisionTower(*cpu, config.vision, cw, patches, grids);

  auto gpu = MakeCudaBackend(0);
  const VisionWeights gw = LoadVisionWeights(ckpt, config, *gpu);
  const Tensor dev_patches = gpu->Upload(patches);
  const Tensor vit = RunVit(*gpu, config.vision, gw, dev_patches, grids);
  const Tensor out = RunVisionTower(*gpu, config.vision, gw, dev_patches, grids);
  std::vector<float> got_vit(vit.numel()), got(out.numel());
  gpu->ToHost(vit, got_vit.data());
  gpu->ToHost(out, got.data());

  const Tensor want_vit = golden->Get("vit_out"), want = golden->Get("aligner_out");
  ASSERT_EQ(vit.shape, want_vit.shape);
  ASSERT_EQ(out.shape, want.shape);
  const double vit_ref = RelL2(got_vit.data(), want_vit.as<float>(), want_vit.numel());
  const double out_ref = RelL2(got.data(), want.as<float>(), want.numel());
  const double vit_cpu = RelL2(got_vit.data(), cpu_vit.as<float>(), cpu_vit.numel());
  const double out_cpu = RelL2(got.data(), cpu_out.as<float>(), cpu_out.numel());
  std::printf("GPU vision tower: ViT rel L2 %.3g vs torch, %.3g vs CPU; aligner rel L2 %.3g vs torch, %.3g vs CPU\n",
              vit_ref, vit_cpu, out_ref, out_cpu);
  EXPECT_LE(vit_ref, kTol);
  EXPECT_LE(out_ref, kTol);
  EXPECT_LE(vit_cpu, kTol);
  EXPECT_LE(out_cpu, kTol);
  // Per image, so that one image cannot hide in the others' norm.
  int64_t row = 0;
  const int64_t hidden = want.shape[1];
  for (const VitGrid& grid : grids) {
    const int64_t rows = AlignerRows(grid, config.vision.downsample_ratio);
    const double e = RelL2(got.data() + row * hidden, want.as<float>() + row * hidden, rows * hidden);
    std::printf("  image %dx%d: rel L2 %.3g vs torch\n", grid.h, grid.w, e);
    EXPECT_LE(e, kTol);
    row += rows;
  }
}

// ---- image rows in the language model ----

struct Fixture {
  std::vector<int32_t> tokens;
  StepImageRows images;  // token indices relative to the whole prompt
  std::vector<float> logits;
};

Fixture ReadImageRowsFixture() {
  auto g = SafetensorsFile::Open(Root() + "/tests/golden/image_rows_v4/golden.safetensors");
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

// The fixture's model: `make-tiny --vision --vocab 512 --sliding-layers 2` (seed 0), written once.
std::string TinyVisionDir() {
  static const std::string dir = [] {
    const std::string d = testing_util::TempDir("gpu_image_rows_model");
    TinyModelSpec spec;
    spec.vision = true;
    spec.vocab_size = 512;
    spec.compress_ratios = {0, 0};
    spec.num_mtp_layers = 0;
    WriteTinyModel(d, 0, spec);
    return d;
  }();
  return dir;
}

std::vector<float> Logits(Model& model, SequenceState* st, const std::vector<int32_t>& tokens,
                          const StepImageRows& images) {
  SequenceStep step{st, tokens, true};
  step.images = images;
  return ToFloatVector(model.Forward({step})[0].logits);
}

TEST(GpuVision, ImageRowsMatchTorchReferenceAndCpu) {
  DSMESH_REQUIRE_GPU();
  const Fixture f = ReadImageRowsFixture();
  auto gpu = LoadModel(TinyVisionDir(), ShardSpec{}, MakeCudaBackend(0));
  auto cpu = LoadModel(TinyVisionDir(), ShardSpec{}, MakeCpuBackend());
  const int64_t V = gpu->config().vocab_size, T = static_cast<int64_t>(f.tokens.size());

  // One step: the whole prompt, the block's 38-row span longer than the 32-row window.
  {
    auto gs = gpu->NewState(), cs = cpu->NewState();
    const std::vector<float> g = Logits(*gpu, gs.get(), f.tokens, f.images);
    ExpectRowsClose(g, f.logits, 0, V, "GPU one step vs torch");
    ExpectRowsClose(g, Logits(*cpu, cs.get(), f.tokens, f.images), 0, V, "GPU one step vs CPU");
  }
  // The text prefix, then the block and the rest: span rows see back into the ring.
  {
    const int64_t cut = f.images.rows.front();
    auto gs = gpu->NewState(), cs = cpu->NewState();
    const std::vector<int32_t> head(f.tokens.begin(), f.tokens.begin() + cut), tail(f.tokens.begin() + cut, f.tokens.end());
    ExpectRowsClose(Logits(*gpu, gs.get(), head, {}), f.logits, 0, V, "GPU text prefix vs torch");
    const StepImageRows rest = testing_util::SliceImageRows(f.images, cut, T);
    const std::vector<float> g = Logits(*gpu, gs.get(), tail, rest);
    ExpectRowsClose(g, f.logits, cut, V, "GPU image step after a prefix vs torch");
    Logits(*cpu, cs.get(), head, {});
    ExpectRowsClose(g, Logits(*cpu, cs.get(), tail, rest), 0, V, "GPU image step after a prefix vs CPU");
  }
  // Beside a text sequence: the text sequence's logits are those it has alone, the image ones the reference's.
  {
    const std::vector<int32_t> words = testing_util::Tokens(9, static_cast<int>(V), 7);
    auto alone = gpu->NewState(), text = gpu->NewState(), img = gpu->NewState();
    const std::vector<float> text_alone = Logits(*gpu, alone.get(), words, {});
    SequenceStep a{text.get(), words, true}, b{img.get(), f.tokens, true};
    b.images = f.images;
    const std::vector<SequenceOutput> out = gpu->Forward({a, b});
    ExpectRowsClose(ToFloatVector(out[0].logits), text_alone, 0, V, "GPU text sequence beside the image one");
    ExpectRowsClose(ToFloatVector(out[1].logits), f.logits, 0, V, "GPU image sequence beside a text one vs torch");
  }
}

// A step of few rows replays the CUDA graphs recorded for earlier steps of its shapes. An image step of
// those shapes places embeddings and routes its image rows with bias_vl, which the text steps' graphs do
// not: it must run its own launches and give the CPU's logits.
TEST(GpuVision, ImageStepAfterGraphsOfTextStepsOfTheSameShape) {
  DSMESH_REQUIRE_GPU();
  auto gpu = LoadModel(TinyVisionDir(), ShardSpec{}, MakeCudaBackend(0));
  auto cpu = LoadModel(TinyVisionDir(), ShardSpec{}, MakeCpuBackend());
  const int64_t V = gpu->config().vocab_size, D = gpu->config().hidden_size, n = 12;
  const std::vector<int32_t> tokens = testing_util::Tokens(static_cast<int>(n), static_cast<int>(V), 3);
  const CudaGraphCounts before = CudaBackendStats(gpu->backend()).graphs;
  for (int i = 0; i < 3; ++i) {  // eager, captured, replayed
    auto st = gpu->NewState();
    Logits(*gpu, st.get(), tokens, {});
  }
  const CudaGraphCounts after = CudaBackendStats(gpu->backend()).graphs;
  ASSERT_GT(after.replays, before.replays) << "the text steps replayed no graph: the test proves nothing";

  // Rows 2..9 are image rows, 3..8 one span; the embeddings are random at the scale of the token table's.
  StepImageRows images;
  for (int64_t r = 2; r <= 9; ++r) images.rows.push_back(r);
  images.spans.push_back({3, 8});
  images.embeddings = AllocateTensor(DType::kF32, {static_cast<int64_t>(images.rows.size()), D});
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < images.embeddings.numel(); ++i) images.embeddings.as<float>()[i] = nd(rng);

  auto gs = gpu->NewState(), cs = cpu->NewState(), plain = cpu->NewState();
  const std::vector<float> want = Logits(*cpu, cs.get(), tokens, images);
  const std::vector<float> text = Logits(*cpu, plain.get(), tokens, {});
  ASSERT_GT(CompareRows(want, text, 0, V).worst, 1e-2) << "the image rows do not change the CPU's logits";
  ExpectRowsClose(Logits(*gpu, gs.get(), tokens, images), want, 0, V, "GPU image step of a graphed shape vs CPU");
}

}  // namespace
}  // namespace dsmesh

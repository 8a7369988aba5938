// The vision tower (model/vision_tower.cc on the CPU backend) against tests/golden/vision_v4: a reduced
// random DeepSeek-V4-Flash-Vision ViT + aligner (2 blocks, width 64, 4 heads, SwiGLU 96, patch 4, r 3,
// hidden 128) run by an independent float64 torch reference (tests/golden/make_vision_fixture.py) on three
// images of different grids.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/testing/test_util.h"
#include "model/vision_tower.h"
#include "model/weights.h"

namespace dsmesh {
namespace {

using testing_util::RelL2;
using testing_util::ThreadCommunicator;
using testing_util::ThreadGroup;

class VisionTowerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* root = std::getenv("DSMESH_ROOT");
    ASSERT_TRUE(root && *root) << "DSMESH_ROOT is not set: run through ./dsmesh test (or export DSMESH_ROOT=<repo root>)";
    dir_ = std::string(root) + "/tests/golden/vision_v4";
    config_ = ModelConfig::FromDirectory(dir_);
    ckpt_ = Checkpoint::Open(dir_);
    weights_ = LoadVisionWeights(ckpt_, config_, *be_);
    golden_ = SafetensorsFile::Open(dir_ + "/golden.safetensors");
    const Tensor g = golden_->Get("grids");
    for (int64_t i = 0; i < g.shape[0]; ++i)
      grids_.push_back({static_cast<int>(g.as<int64_t>()[2 * i]), static_cast<int>(g.as<int64_t>()[2 * i + 1])});
  }

  std::shared_ptr<Backend> be_ = MakeCpuBackend();
  std::string dir_;
  ModelConfig config_;
  Checkpoint ckpt_;
  VisionWeights weights_;
  std::shared_ptr<SafetensorsFile> golden_;
  std::vector<VitGrid> grids_;
};

TEST_F(VisionTowerTest, ConfigAndWeightsComeFromTheCheckpoint) {
  const VisionConfig& v = config_.vision;
  EXPECT_EQ(v.n_layers, 2);
  EXPECT_EQ(v.dim, 64);
  EXPECT_EQ(v.n_heads, 4);
  EXPECT_EQ(v.inter_dim, 96);
  EXPECT_EQ(v.patch_size, 4);
  EXPECT_EQ(weights_.blocks.size(), 2u);
  EXPECT_EQ(weights_.patch_embed.in, 48);
  EXPECT_EQ(weights_.aligner_w1.in, 64 * 9);
  EXPECT_EQ(weights_.aligner_w1.out, config_.hidden_size);
  EXPECT_EQ(weights_.image_newline.numel(), config_.hidden_size);
  EXPECT_EQ(grids_.size(), 3u);
}

TEST_F(VisionTowerTest, MatchesTheTorchReference) {
  const Tensor patches = golden_->Get("patches");
  const Tensor want_vit = golden_->Get("vit_out"), want = golden_->Get("aligner_out");

  const Tensor vit = RunVit(*be_, config_.vision, weights_, patches, grids_);
  ASSERT_EQ(vit.shape, want_vit.shape);
  const double vit_err = RelL2(vit.as<float>(), want_vit.as<float>(), want_vit.numel());

  const Tensor out = RunVisionTower(*be_, config_.vision, weights_, patches, grids_);
  ASSERT_EQ(out.shape, want.shape);
  const double err = RelL2(out.as<float>(), want.as<float>(), want.numel());
  std::printf("vision tower vs torch reference: ViT rel L2 %.3g, aligner rel L2 %.3g\n", vit_err, err);
  EXPECT_LE(vit_err, 1e-4);
  EXPECT_LE(err, 1e-4);

  // Per image too, so one image cannot hide in the others' norm.
  int64_t row = 0;
  const int64_t hidden = want.shape[1];
  for (const VitGrid& g : grids_) {
    const int64_t rows = AlignerRows(g, config_.vision.downsample_ratio);
    const double e = RelL2(out.as<float>() + row * hidden, want.as<float>() + row * hidden, rows * hidden);
    std::printf("  image %dx%d: %lld aligner rows, rel L2 %.3g\n", g.h, g.w, static_cast<long long>(rows), e);
    EXPECT_LE(e, 1e-4);
    row += rows;
  }
}

TEST_F(VisionTowerTest, ImagesDoNotSeeEachOther) {
  // The last image alone gives the rows it gets in the batch.
  const Tensor patches = golden_->Get("patches");
  const Tensor all = RunVisionTower(*be_, config_.vision, weights_, patches, grids_);
  const VitGrid last = grids_.back();
  const int64_t n = static_cast<int64_t>(last.h) * last.w, rows = AlignerRows(last, config_.vision.downsample_ratio);
  const Tensor alone = RunVisionTower(*be_, config_.vision, weights_, RowView(patches, patches.shape[0] - n, n), {last});
  const int64_t hidden = all.shape[1];
  EXPECT_LE(RelL2(alone.as<float>(), all.as<float>() + (all.shape[0] - rows) * hidden, rows * hidden), 1e-6);
}

TEST_F(VisionTowerTest, PatchesThatDoNotMatchTheGridsAreRefused) {
  const Tensor patches = golden_->Get("patches");
  EXPECT_THROW(RunVisionTower(*be_, config_.vision, weights_, patches, {grids_[0]}), std::runtime_error);
}

// One rank's outputs of a tensor-parallel run of the tower (MakeVisionShardLayout's split of `world`).
struct RankRun {
  VisionWeights weights;
  Tensor vit, out;
  std::string error;
};

// Loads rank r's shard on each of `world` threads (a CPU backend each, ThreadCommunicator between them) and
// runs the ViT and the whole tower on the same patches.
std::vector<RankRun> RunSharded(const Checkpoint& ckpt, const ModelConfig& config, const Tensor& patches,
                                const std::vector<VitGrid>& grids, int world) {
  ThreadGroup group(world);
  std::vector<RankRun> runs(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator comm(&group, r, world);
        auto be = MakeCpuBackend(1);
        runs[r].weights = LoadVisionWeights(ckpt, config, MakeVisionShardLayout(config, ShardSpec{r, world}), *be);
        runs[r].vit = RunVit(*be, config.vision, runs[r].weights, patches, grids, &comm);
        runs[r].out = RunVisionTower(*be, config.vision, runs[r].weights, patches, grids, &comm);
      } catch (const std::exception& e) {
        runs[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return runs;
}

TEST_F(VisionTowerTest, TensorParallelMatchesSingleRankAndTheTorchReference) {
  const Tensor patches = golden_->Get("patches");
  const Tensor want_vit = golden_->Get("vit_out"), want = golden_->Get("aligner_out");
  const Tensor single_vit = RunVit(*be_, config_.vision, weights_, patches, grids_);
  const Tensor single = RunVisionTower(*be_, config_.vision, weights_, patches, grids_);
  const int64_t dim = config_.vision.dim, hidden = config_.hidden_size;
  for (int world : {2, 4}) {
    const std::vector<RankRun> runs = RunSharded(ckpt_, config_, patches, grids_, world);
    for (int r = 0; r < world; ++r) {
      const RankRun& run = runs[r];
      ASSERT_EQ(run.error, "") << "world " << world << " rank " << r;
      // The rank holds its heads' q/k/v rows and wo columns, its SwiGLU and aligner columns, and the
      // row-parallel biases only on rank 0.
      EXPECT_EQ(run.weights.tower_world, world);
      EXPECT_EQ(run.weights.aligner_world, world);
      EXPECT_EQ(run.weights.local_heads, config_.vision.n_heads / world);
      const VisionBlockWeights& b = run.weights.blocks[0];
      EXPECT_EQ(b.wq.out, dim / world);
      EXPECT_EQ(b.wv.bias.numel(), dim / world);
      EXPECT_EQ(b.wo.in, dim / world);
      EXPECT_EQ(b.wo.out, dim);
      EXPECT_EQ(b.wo.bias.data != nullptr, r == 0);
      if (r == 0) {
        EXPECT_EQ(b.wo.bias.numel(), dim);
      }
      EXPECT_EQ(b.mlp.w1.out, config_.vision.inter_dim / world);
      EXPECT_EQ(b.mlp.w2.in, config_.vision.inter_dim / world);
      EXPECT_EQ(run.weights.aligner_w1.out, hidden / world);
      EXPECT_EQ(run.weights.aligner_w2.in, hidden / world);
      EXPECT_EQ(run.weights.aligner_w2.bias.data != nullptr, r == 0);
      EXPECT_LT(run.weights.bytes, weights_.bytes);

      ASSERT_EQ(run.out.shape, single.shape);
      const double vs_single_vit = RelL2(run.vit.as<float>(), single_vit.as<float>(), single_vit.numel());
      const double vs_single = RelL2(run.out.as<float>(), single.as<float>(), single.numel());
      const double vs_torch = RelL2(run.out.as<float>(), want.as<float>(), want.numel());
      const double vit_vs_torch = RelL2(run.vit.as<float>(), want_vit.as<float>(), want_vit.numel());
      std::printf("world %d rank %d: %zu of %zu tower bytes; vs TP1: ViT rel L2 %.3g, aligner %.3g; vs torch: "
                  "ViT %.3g, aligner %.3g\n",
                  world, r, run.weights.bytes, weights_.bytes, vs_single_vit, vs_single, vit_vs_torch, vs_torch);
      EXPECT_LE(vs_single_vit, 1e-6);
      EXPECT_LE(vs_single, 1e-6);
      EXPECT_LE(vit_vs_torch, 1e-4);
      EXPECT_LE(vs_torch, 1e-4);
    }
  }
}

TEST_F(VisionTowerTest, AWorldTheHeadsDoNotDivideByReplicatesTheTower) {
  // 4 heads and hidden 128 over 3 ranks: the ViT and the aligner stay whole on every rank.
  const Tensor patches = golden_->Get("patches");
  const Tensor single = RunVisionTower(*be_, config_.vision, weights_, patches, grids_);
  const std::vector<RankRun> runs = RunSharded(ckpt_, config_, patches, grids_, 3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(runs[r].error, "") << "rank " << r;
    EXPECT_EQ(runs[r].weights.tower_world, 1);
    EXPECT_EQ(runs[r].weights.aligner_world, 1);
    EXPECT_EQ(runs[r].weights.local_heads, config_.vision.n_heads);
    EXPECT_EQ(runs[r].weights.bytes, weights_.bytes);
    EXPECT_EQ(runs[r].weights.blocks[0].wo.bias.numel(), config_.vision.dim);
    ASSERT_EQ(runs[r].out.shape, single.shape);
    EXPECT_EQ(RelL2(runs[r].out.as<float>(), single.as<float>(), single.numel()), 0.0) << "rank " << r;
  }
}

TEST_F(VisionTowerTest, ShardedWeightsNeedTheirWorld) {
  // A rank's shard of a 2-way split run without its peers is refused, not silently summed over one rank.
  const VisionWeights half = LoadVisionWeights(ckpt_, config_, MakeVisionShardLayout(config_, ShardSpec{0, 2}), *be_);
  EXPECT_THROW(RunVisionTower(*be_, config_.vision, half, golden_->Get("patches"), grids_), std::runtime_error);
}

TEST(VisionRopeAnglesTest, RowAnglesThenColumnAngles) {
  // head_dim 16: rope_dim 8, inv_freq = 10000^(-0/8, -2/8, -4/8, -6/8).
  const std::vector<float> a = VisionRopeAngles({2, 3}, 16, 10000.0);
  ASSERT_EQ(a.size(), 6u * 8);
  const int64_t patch = 1 * 3 + 2;  // row 1, column 2
  EXPECT_FLOAT_EQ(a[patch * 8 + 0], 1.0f);
  EXPECT_FLOAT_EQ(a[patch * 8 + 1], 0.1f);
  EXPECT_FLOAT_EQ(a[patch * 8 + 4], 2.0f);
  EXPECT_FLOAT_EQ(a[patch * 8 + 7], 2.0f * 0.001f);
}

}  // namespace
}  // namespace dsmesh

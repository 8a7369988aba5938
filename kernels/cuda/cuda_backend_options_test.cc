// CudaBackendOptionsFromEnvironment (the CLI's and the worker's way to set the A/B variants and the EXL3
// kernels' tuning), the workspaces' range checks of that tuning, and CudaBackendStats on a backend that is
// not a CUDA one. Runs without a GPU.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/exl3_gemv.h"
#include "kernels/cuda/exl3_moe.h"

namespace dsmesh {
namespace {

constexpr const char* kVariables[] = {"DSMESH_CUDA_STATEFUL_GRAPHS",  "DSMESH_CUDA_BLOCK_GRAPHS", "DSMESH_CUDA_PREFILL_MOE",
                                      "DSMESH_CUDA_PREFILL_ATTENTION", "DSMESH_CUDA_PDL",
                                      "DSMESH_EXL3_GEMV_CTAS_PER_SM",  "DSMESH_EXL3_MOE_ITEMS_PER_SM",
                                      "DSMESH_EXL3_MOE_DOWN_WIDE",     "DSMESH_EXL3_MOE_FUSED_FINISH",
                                      "DSMESH_EXL3_MOE_SPLITS"};

class CudaOptionsEnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVariables) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVariables) unsetenv(v);
  }
};

TEST_F(CudaOptionsEnvironmentTest, UnsetKeepsTheGivenOptions) {
  CudaBackendOptions given;
  given.cuda_graphs = false;
  given.stateful_graphs = false;
  given.prefill_moe = CudaBackendOptions::PrefillMoe::kRowSlices;
  given.prefill_attention = CudaBackendOptions::PrefillAttention::kSplit;
  given.pdl = true;
  given.block_graphs = true;
  const CudaBackendOptions o = CudaBackendOptionsFromEnvironment(given);
  EXPECT_TRUE(o.pdl);
  EXPECT_TRUE(o.block_graphs);
  EXPECT_FALSE(o.cuda_graphs);
  EXPECT_FALSE(o.stateful_graphs);
  EXPECT_EQ(o.prefill_moe, CudaBackendOptions::PrefillMoe::kRowSlices);
  EXPECT_EQ(o.prefill_attention, CudaBackendOptions::PrefillAttention::kSplit);
  const CudaBackendOptions d = CudaBackendOptionsFromEnvironment();
  EXPECT_FALSE(d.pdl);  // off unless asked for
  EXPECT_FALSE(d.block_graphs);
  EXPECT_TRUE(d.stateful_graphs);
  EXPECT_EQ(d.prefill_moe, CudaBackendOptions::PrefillMoe::kSortedPairs);
  EXPECT_EQ(d.prefill_attention, CudaBackendOptions::PrefillAttention::kMma);
}

TEST_F(CudaOptionsEnvironmentTest, EveryValueTheDocsName) {
  setenv("DSMESH_CUDA_STATEFUL_GRAPHS", "off", 1);
  EXPECT_FALSE(CudaBackendOptionsFromEnvironment().stateful_graphs);
  setenv("DSMESH_CUDA_STATEFUL_GRAPHS", "on", 1);
  EXPECT_TRUE(CudaBackendOptionsFromEnvironment().stateful_graphs);
  for (const char* value : {"1", "on"}) {
    setenv("DSMESH_CUDA_BLOCK_GRAPHS", value, 1);
    EXPECT_TRUE(CudaBackendOptionsFromEnvironment().block_graphs) << value;
  }
  CudaBackendOptions blocks_on;
  blocks_on.block_graphs = true;
  for (const char* value : {"0", "off"}) {
    setenv("DSMESH_CUDA_BLOCK_GRAPHS", value, 1);
    EXPECT_FALSE(CudaBackendOptionsFromEnvironment(blocks_on).block_graphs) << value;
  }
  CudaBackendOptions pdl_on;
  pdl_on.pdl = true;
  for (const char* value : {"1", "on"}) {
    setenv("DSMESH_CUDA_PDL", value, 1);
    EXPECT_TRUE(CudaBackendOptionsFromEnvironment().pdl) << value;
  }
  for (const char* value : {"0", "off"}) {
    setenv("DSMESH_CUDA_PDL", value, 1);
    EXPECT_FALSE(CudaBackendOptionsFromEnvironment(pdl_on).pdl) << value;
  }
  const std::pair<const char*, CudaBackendOptions::PrefillMoe> moe[] = {
      {"per-expert", CudaBackendOptions::PrefillMoe::kPerExpert},
      {"row-slices", CudaBackendOptions::PrefillMoe::kRowSlices},
      {"sorted-pairs", CudaBackendOptions::PrefillMoe::kSortedPairs}};
  for (const auto& [value, want] : moe) {
    setenv("DSMESH_CUDA_PREFILL_MOE", value, 1);
    EXPECT_EQ(CudaBackendOptionsFromEnvironment().prefill_moe, want) << value;
  }
  const std::pair<const char*, CudaBackendOptions::PrefillAttention> attention[] = {
      {"mma", CudaBackendOptions::PrefillAttention::kMma},
      {"mma-fp16", CudaBackendOptions::PrefillAttention::kMmaFp16},
      {"split", CudaBackendOptions::PrefillAttention::kSplit},
      {"per-row", CudaBackendOptions::PrefillAttention::kPerRow}};
  for (const auto& [value, want] : attention) {
    setenv("DSMESH_CUDA_PREFILL_ATTENTION", value, 1);
    EXPECT_EQ(CudaBackendOptionsFromEnvironment().prefill_attention, want) << value;
  }
}

// The EXL3 kernels' tuning: the environment's values into the options (the CLI's and the kernel bench's
// way), unset ones keeping what the caller gave.
TEST_F(CudaOptionsEnvironmentTest, Exl3TuningFromTheEnvironment) {
  CudaBackendOptions given;
  given.gemv.ctas_per_sm = 3;
  given.moe.splits = 7;
  CudaBackendOptions o = CudaBackendOptionsFromEnvironment(given);
  EXPECT_EQ(o.gemv.ctas_per_sm, 3);
  EXPECT_EQ(o.moe.splits, 7);
  EXPECT_EQ(o.moe.items_per_sm, kExl3MoeItemsPerSm);
  EXPECT_EQ(o.moe.down_wide, -1);
  EXPECT_EQ(o.moe.fused_finish, -1);
  setenv("DSMESH_EXL3_GEMV_CTAS_PER_SM", "1", 1);
  setenv("DSMESH_EXL3_MOE_ITEMS_PER_SM", "5", 1);
  setenv("DSMESH_EXL3_MOE_DOWN_WIDE", "0", 1);
  setenv("DSMESH_EXL3_MOE_FUSED_FINISH", "1", 1);
  setenv("DSMESH_EXL3_MOE_SPLITS", "16", 1);
  o = CudaBackendOptionsFromEnvironment(given);
  EXPECT_EQ(o.gemv.ctas_per_sm, 1);
  EXPECT_EQ(o.moe.items_per_sm, 5);
  EXPECT_EQ(o.moe.down_wide, 0);
  EXPECT_EQ(o.moe.fused_finish, 1);
  EXPECT_EQ(o.moe.splits, 16);
  EXPECT_EQ(Exl3GemvTuningFromEnvironment().ctas_per_sm, 1);
  EXPECT_EQ(Exl3MoeTuningFromEnvironment().items_per_sm, 5);
  setenv("DSMESH_EXL3_GEMV_CTAS_PER_SM", "17", 1);
  EXPECT_THROW(Exl3GemvTuningFromEnvironment(), std::runtime_error);
  setenv("DSMESH_EXL3_MOE_DOWN_WIDE", "2", 1);
  EXPECT_THROW(Exl3MoeTuningFromEnvironment(), std::runtime_error);
}

// A workspace refuses a tuning out of range before it touches the device (so this runs without a GPU).
TEST(Exl3TuningTest, WorkspacesRefuseTuningsOutOfRange) {
  EXPECT_THROW(Exl3GemvWorkspace(16u << 20, Exl3GemvTuning{0}), std::runtime_error);
  EXPECT_THROW(Exl3GemvWorkspace(16u << 20, Exl3GemvTuning{17}), std::runtime_error);
  Exl3MoeTuning bad;
  bad.items_per_sm = 0;
  EXPECT_THROW(Exl3MoeWorkspace(24, 6, 512, 256, bad), std::runtime_error);
  bad = {};
  bad.fused_finish = 2;
  EXPECT_THROW(Exl3MoeWorkspace(24, 6, 512, 256, bad), std::runtime_error);
  bad = {};
  bad.splits = -1;
  EXPECT_THROW(Exl3MoeWorkspace::ForSortedPairs(100, 512, 256, bad), std::runtime_error);
}

// A misspelt variant is an error naming the variable, not a silent run of the default path.
TEST_F(CudaOptionsEnvironmentTest, UnknownValueNamesTheVariable) {
  for (const char* v :
       {"DSMESH_CUDA_STATEFUL_GRAPHS", "DSMESH_CUDA_BLOCK_GRAPHS", "DSMESH_CUDA_PREFILL_MOE",
        "DSMESH_CUDA_PREFILL_ATTENTION", "DSMESH_CUDA_PDL"}) {
    setenv(v, "per_expert", 1);
    try {
      CudaBackendOptionsFromEnvironment();
      ADD_FAILURE() << v << "=per_expert was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(v) + "=per_expert: expected"), std::string::npos) << e.what();
    }
    unsetenv(v);
  }
}

TEST(CudaBackendVariantsTest, NamesWhatDiffersFromTheDefaults) {
  EXPECT_EQ(CudaBackendVariants({}), "");
  CudaBackendOptions o;
  o.prefill_moe = CudaBackendOptions::PrefillMoe::kPerExpert;
  o.prefill_attention = CudaBackendOptions::PrefillAttention::kMmaFp16;
  o.stateful_graphs = false;
  EXPECT_EQ(CudaBackendVariants(o),
            "prefill chunks: routed experts per expert attention on tensor cores with fp16 operands; stateful "
            "segments run eagerly");
  CudaBackendOptions pdl;
  pdl.pdl = true;
  EXPECT_EQ(CudaBackendVariants(pdl), "programmatic dependent launch");
}

TEST(CudaBackendStatsTest, ZeroForABackendThatIsNotCuda) {
  auto cpu = MakeCpuBackend();
  const CudaBackendStatistics s = CudaBackendStats(*cpu);
  EXPECT_EQ(s.graphs.captures, 0);
  EXPECT_EQ(s.graphs.replays, 0);
  EXPECT_EQ(s.moe.fused_launches, 0);
  EXPECT_EQ(s.gemv_batches.launches, 0);
  EXPECT_EQ(s.per_sequence_fallbacks, 0);
  EXPECT_EQ(s.pdl_launches, 0);
  EXPECT_EQ(CudaBackendStream(*cpu).cuda_stream, nullptr);
}

}  // namespace
}  // namespace dsmesh

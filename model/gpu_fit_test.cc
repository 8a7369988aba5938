// The GPU fit check without a GPU: GpuFitProblem's verdict and message from given sizes, and the weight
// bound read from a checkpoint's headers against what the loader actually holds.
#include "model/gpu_fit.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using testing_util::TempDir;
using testing_util::ThreadCommunicator;
using testing_util::ThreadGroup;

constexpr int64_t kGiB = int64_t{1} << 30;

GpuFitSizes H200(int64_t weights, int64_t kv, int64_t free_bytes) {
  GpuFitSizes s;
  s.model = "/models/big";
  s.device = "cuda:0";
  s.weight_bytes = weights;
  s.kv_bytes = kv;
  s.kv_what = "the smallest KV pool";
  s.free_bytes = free_bytes;
  s.total_bytes = 140 * kGiB;
  return s;
}

TEST(GpuFit, FitsWhenWeightsAndKvPoolAreWithinFreeMemory) {
  EXPECT_EQ(GpuFitProblem(H200(100 * kGiB, kGiB, 139 * kGiB)), "");
  EXPECT_EQ(GpuFitProblem(H200(138 * kGiB, kGiB, 139 * kGiB)), "");  // exactly full
}

TEST(GpuFit, TooLargeNamesModelDeviceBothSizesAndTheWaysOut) {
  const std::string m = GpuFitProblem(H200(150 * kGiB, kGiB / 2, 139 * kGiB));
  ASSERT_NE(m, "");
  for (const char* part : {"/models/big does not fit on cuda:0", "150.00 GiB", "the smallest KV pool 0.50 GiB",
                           "150.50 GiB in all", "139.00 GiB free (of 140.00 GiB)", "smaller pack", "--world N",
                           "--device cpu", "(the whole pack)"})
    EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
  // The KV pool alone can tip it over.
  EXPECT_NE(GpuFitProblem(H200(139 * kGiB, kGiB, 139 * kGiB)), "");
  GpuFitSizes split = H200(80 * kGiB, kGiB, 60 * kGiB);
  split.world = 2;
  EXPECT_NE(GpuFitProblem(split).find("(the pack over --world 2)"), std::string::npos) << GpuFitProblem(split);
}

// The bound from the headers is what the loader uploads at world 1 (within its f32 conversions of
// small parameters) and never more than a rank holds at world 2.
TEST(GpuFit, WeightBoundFromHeadersMatchesTheLoadedShard) {
  const std::string dir = TempDir("gpu_fit_tiny");
  WriteTinyModel(dir, 1);
  const int64_t bound1 = ShardWeightBytesAtLeast(dir, 1), bound2 = ShardWeightBytesAtLeast(dir, 2);
  auto one = LoadModel(dir, ShardSpec{0, 1}, MakeCpuBackend(1));
  const auto held1 = static_cast<int64_t>(one->WeightBytes());
  EXPECT_LE(bound1, held1);
  EXPECT_GE(bound1, held1 * 9 / 10) << "bound " << bound1 << " held " << held1;
  ThreadGroup group(2);
  std::vector<int64_t> held2(2, -1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank)
    threads.emplace_back([&, rank] {
      ThreadCommunicator comm(&group, rank, 2);
      held2[rank] = static_cast<int64_t>(LoadModel(dir, ShardSpec{rank, 2}, MakeCpuBackend(1), &comm)->WeightBytes());
    });
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) EXPECT_LE(bound2, held2[rank]) << "rank " << rank;
  EXPECT_GT(MinimumKvPoolBytes(dir, KvCacheDtype::kF32), MinimumKvPoolBytes(dir, KvCacheDtype::kFp8));
  EXPECT_GT(MinimumKvPoolBytes(dir, KvCacheDtype::kFp8), 0);
}

}  // namespace
}  // namespace dsmesh

// graph_chain.h on a graph captured here: its node kinds and longest chain with a side-stream branch, and
// its empty-kernel copy keeping the shape but doing no work (skips without a GPU).
#include "kernels/cuda/graph_chain.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/gpu_test_util.h"
#include "kernels/cuda/model_ops.h"

namespace dsmesh {
namespace {

using testing::DeviceBuffer;

// Captures: x *= 2 (K1); on a side stream after K1: acc += a (K2); on the main stream: y *= 3 (K3); joined,
// then z set to 0 (memset) and z copied to w (memcpy). Edges K1->K2, K1->K3, K2->set, K3->set, set->copy:
// 5 nodes, chain 4.
struct Captured {
  DeviceBuffer<float> x{std::vector<float>(256, 1.0f)}, acc{std::vector<float>(256, 1.0f)},
      a{std::vector<float>(256, 5.0f)}, y{std::vector<float>(256, 1.0f)}, z{std::vector<float>(64, 7.0f)},
      w{std::vector<float>(64, 9.0f)};
  cudaStream_t main = nullptr, side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaGraph_t graph = nullptr;

  Captured() {
    CudaCheck(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking), "stream");
    CudaCheck(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "stream");
    CudaCheck(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "event");
    CudaCheck(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "event");
    CudaCheck(cudaStreamBeginCapture(main, cudaStreamCaptureModeThreadLocal), "begin capture");
    cuda_ops::Scale(x.get(), 256, 2.0f, main);
    CudaCheck(cudaEventRecord(fork, main), "fork");
    CudaCheck(cudaStreamWaitEvent(side, fork, 0), "fork wait");
    cuda_ops::Add(a.get(), 256, acc.get(), side);
    CudaCheck(cudaEventRecord(join, side), "join");
    cuda_ops::Scale(y.get(), 256, 3.0f, main);
    CudaCheck(cudaStreamWaitEvent(main, join, 0), "join wait");
    CudaCheck(cudaMemsetAsync(z.get(), 0, 64 * sizeof(float), main), "memset");
    CudaCheck(cudaMemcpyAsync(w.get(), z.get(), 64 * sizeof(float), cudaMemcpyDeviceToDevice, main), "memcpy");
    CudaCheck(cudaStreamEndCapture(main, &graph), "end capture");
  }
  ~Captured() {
    cudaGraphDestroy(graph);
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaStreamDestroy(main);
    cudaStreamDestroy(side);
  }
};

TEST(GraphChain, ShapeCountsKindsAndTheLongestChain) {
  DSMESH_REQUIRE_GPU();
  Captured c;
  const GraphShape s = ShapeOfGraph(c.graph);
  EXPECT_EQ(s.kernels, 3);
  EXPECT_EQ(s.memsets, 1);
  EXPECT_EQ(s.memcpys, 1);
  EXPECT_EQ(s.nodes, 5 + s.other);
  EXPECT_EQ(s.chain, 4);
  EXPECT_LE(s.chain, s.nodes);
}

TEST(GraphChain, TheEmptiedCopyRunsNoWorkAndTheRecordedOneDoes) {
  DSMESH_REQUIRE_GPU();
  Captured c;
  int64_t kept = 0;
  cudaGraphExec_t emptied = InstantiateEmptied(c.graph, &kept);
  EXPECT_EQ(kept, 0);
  EXPECT_EQ(ShapeOfGraph(c.graph).chain, 4);  // the original is untouched
  CudaCheck(cudaGraphLaunch(emptied, c.main), "launch emptied");
  CudaCheck(cudaStreamSynchronize(c.main), "sync");
  EXPECT_EQ(c.x.Download(), std::vector<float>(256, 1.0f));
  EXPECT_EQ(c.acc.Download(), std::vector<float>(256, 1.0f));
  EXPECT_EQ(c.y.Download(), std::vector<float>(256, 1.0f));
  // The set and the copy touched one byte each: every float past the first is untouched.
  const std::vector<float> w = c.w.Download();
  for (int i = 1; i < 64; ++i) EXPECT_EQ(w[i], 9.0f) << i;
  const std::vector<float> z = c.z.Download();
  for (int i = 1; i < 64; ++i) EXPECT_EQ(z[i], 7.0f) << i;

  cudaGraphExec_t real = nullptr;
  CudaCheck(cudaGraphInstantiate(&real, c.graph, 0), "instantiate");
  CudaCheck(cudaGraphLaunch(real, c.main), "launch real");
  CudaCheck(cudaStreamSynchronize(c.main), "sync");
  EXPECT_EQ(c.x.Download(), std::vector<float>(256, 2.0f));
  EXPECT_EQ(c.acc.Download(), std::vector<float>(256, 6.0f));
  EXPECT_EQ(c.y.Download(), std::vector<float>(256, 3.0f));
  EXPECT_EQ(c.w.Download(), std::vector<float>(64, 0.0f));

  const double real_ms = TimeGraphReplays({real}, 20, c.main), empty_ms = TimeGraphReplays({emptied}, 20, c.main);
  EXPECT_GT(real_ms, 0);
  EXPECT_GT(empty_ms, 0);
  std::printf("5-node graph: %.2f us recorded, %.2f us emptied per replay\n", 1e3 * real_ms, 1e3 * empty_ms);
  cudaGraphExecDestroy(real);
  cudaGraphExecDestroy(emptied);
}

}  // namespace
}  // namespace dsmesh

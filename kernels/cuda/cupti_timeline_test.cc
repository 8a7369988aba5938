// CuptiTimeline: CUPTI loads and names runtime calls (no GPU needed); on a GPU, the records of one "step"
// (a parameter upload, a graph of three kernels, an eager kernel, a copy back and a sync), their links to
// the runtime calls that launched them and the step analysis over them, and a second timeline in the same
// process recording again (the bench traces once per shape). The GPU tests skip without a GPU.
#include "kernels/cuda/cupti_timeline.h"

#include <cuda_runtime.h>
#include <cupti.h>
#include <gtest/gtest.h>

#include <map>

#include "kernels/cuda/cupti_library.h"
#include "kernels/cuda/empty_kernel.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/timeline/step_timeline.h"

namespace dsmesh {
namespace {

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

TEST(CuptiTimeline, LoadsAndNamesRuntimeCalls) {
  ASSERT_EQ(CuptiLoadError(), "");
  EXPECT_EQ(CuptiRuntimeCallName(CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000), "cudaGraphLaunch");
  EXPECT_EQ(CuptiRuntimeCallName(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020), "cudaMemcpyAsync");
}

// A stream, a graph of three empty kernels launched once before tracing (as the bench's graphs are
// recorded before it traces), and a pinned buffer of 256 bytes with its device copy.
struct Step {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  void* host = nullptr;
  void* dev = nullptr;

  Step() {
    CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    CudaCheck(cudaMallocHost(&host, 256), "pinned");
    CudaCheck(cudaMalloc(&dev, 256), "device");
    CudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    for (int i = 0; i < 3; ++i) Empty();
    CudaCheck(cudaStreamEndCapture(stream, &graph), "end capture");
    CudaCheck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    CudaCheck(cudaGraphLaunch(exec, stream), "launch");
    CudaCheck(cudaStreamSynchronize(stream), "sync");
  }
  ~Step() {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFreeHost(host);
    cudaFree(dev);
    cudaStreamDestroy(stream);
  }
  void Empty() {
    CudaCheck(cudaLaunchKernel(cuda_ops::EmptyKernelFunction(), dim3(1), dim3(32), nullptr, 0, stream), "empty kernel");
  }
  // What a decode step does, in small: upload, graph, eager kernel, copy back, wait.
  void Run() {
    CudaCheck(cudaMemcpyAsync(dev, host, 256, cudaMemcpyHostToDevice, stream), "upload");
    CudaCheck(cudaGraphLaunch(exec, stream), "launch");
    Empty();
    CudaCheck(cudaMemcpyAsync(host, dev, 256, cudaMemcpyDeviceToHost, stream), "download");
    CudaCheck(cudaStreamSynchronize(stream), "sync");
  }
};

// Traces one Run between two timestamps; checks the records and returns the step's analysis.
StepTimelineSummary TraceOneStep(Step& step) {
  CuptiTimeline timeline;
  const uint64_t begin = timeline.Now();
  step.Run();
  const StepWindow window{begin, timeline.Now()};
  const TimelineTrace trace = timeline.Finish();
  EXPECT_EQ(trace.dropped, 0u);
  std::map<uint32_t, std::string> calls;  // correlation id -> runtime call
  for (const TimelineRecord& r : trace.records)
    if (r.kind == TimelineKind::kApi) calls[r.correlation_id] = r.name;
  int graph_kernels = 0, eager_kernels = 0, uploads = 0, downloads = 0;
  for (const TimelineRecord& r : trace.records) {
    if (!r.device()) continue;
    EXPECT_GE(r.start_ns, window.begin_ns) << r.name;
    EXPECT_LE(r.end_ns, window.end_ns) << r.name;
    EXPECT_LE(r.start_ns, r.end_ns) << r.name;
    const std::string call = calls.count(r.correlation_id) ? calls[r.correlation_id] : "(none)";
    if (r.kind == TimelineKind::kKernel) {
      EXPECT_EQ(ShortKernelName(r.name), "EmptyKernel") << r.name;
      if (r.graph_id != 0) {
        ++graph_kernels;
        EXPECT_TRUE(StartsWith(call, "cudaGraphLaunch")) << call;
      } else {
        ++eager_kernels;
        EXPECT_TRUE(StartsWith(call, "cudaLaunchKernel")) << call;
      }
    } else if (r.kind == TimelineKind::kMemcpy) {
      EXPECT_EQ(r.bytes, 256u);
      EXPECT_EQ(call, "cudaMemcpyAsync");
      uploads += r.name == "memcpy HtoD (pinned)";
      downloads += r.name == "memcpy DtoH (pinned)";
    }
  }
  EXPECT_EQ(graph_kernels, 3);
  EXPECT_EQ(eager_kernels, 1);
  EXPECT_EQ(uploads, 1);
  EXPECT_EQ(downloads, 1);
  return AnalyzeStepTimeline(trace.records, {window});
}

TEST(CuptiTimeline, RecordsAStepAndItsLaunches) {
  DSMESH_REQUIRE_GPU();
  Step step;
  const StepTimelineSummary s = TraceOneStep(step);
  EXPECT_EQ(s.graph_launches, 1);
  EXPECT_EQ(s.kernels, 4);
  EXPECT_EQ(s.graph_kernels, 3);
  EXPECT_EQ(s.memcpys, 2);
  EXPECT_EQ(s.unmatched_work, 0);
  EXPECT_EQ(s.work_before_call, 0);
  EXPECT_EQ(s.steps_without_work, 0);
  EXPECT_GT(s.busy_ns, 0u);
  EXPECT_LT(s.busy_ns, s.wall_ns);
  EXPECT_GE(s.sync_calls, 1);
  uint64_t gaps = 0;
  for (const GapTotals& g : s.gaps) gaps += g.ns;
  EXPECT_EQ(gaps, s.idle_ns());
  // The upload is followed by the graph: that gap is "around a copy", the graph's own are inside it.
  EXPECT_EQ(s.gaps[static_cast<int>(GapCause::kAroundCopy)].count, 2);
  EXPECT_LE(s.gaps[static_cast<int>(GapCause::kInsideGraph)].count, 2);
}

TEST(CuptiTimeline, ASecondTimelineRecordsAgainAndOnlyOneAtATime) {
  DSMESH_REQUIRE_GPU();
  Step step;
  EXPECT_EQ(TraceOneStep(step).kernels, 4);
  {
    CuptiTimeline open;
    EXPECT_THROW(CuptiTimeline(), std::runtime_error);
  }
  step.Run();  // untraced: the closed timeline keeps nothing of it
  EXPECT_EQ(TraceOneStep(step).kernels, 4);
}

}  // namespace
}  // namespace dsmesh

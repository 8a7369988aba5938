#include "kernels/cuda/cuda_side_streams.h"

#include <algorithm>
#include <cstdio>

#include "kernels/cuda/cuda_check.h"

namespace dsmesh {

SideStreams::~SideStreams() {
  for (SideStream& sd : side_) {
    sd.gemv_ws.reset();
    cudaStreamDestroy(sd.stream);
    cudaEventDestroy(sd.done);
  }
  if (fork_) cudaEventDestroy(fork_);
}

bool SideStreams::Allowed(bool requested, const StepArena& arena) {
  if (!requested) return false;
  if (arena.in_step() && arena.top() + (size_t{64} << 20) <= arena.bytes()) return true;
  if (!logged_serial_) {
    std::fprintf(stderr, "[cuda] --concurrent-linears: linears outside a step or with the scratch arena nearly "
                         "full run in order (logged once)\n");
    logged_serial_ = true;
  }
  return false;
}

void SideStreams::Run(int n, const std::function<void(int, cudaStream_t, Exl3GemvWorkspace&)>& job) {
  if (side_.empty()) {
    CudaCheck(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate (fork)");
    side_.resize(kSideStreams);
    for (SideStream& sd : side_) {
      CudaCheck(cudaStreamCreateWithFlags(&sd.stream, cudaStreamNonBlocking), "cudaStreamCreate (side)");
      CudaCheck(cudaEventCreateWithFlags(&sd.done, cudaEventDisableTiming), "cudaEventCreate (join)");
      sd.gemv_ws = std::make_unique<Exl3GemvWorkspace>(size_t{64} << 20, gemv_tuning_);
    }
  }
  const int used = std::min(n, kSideStreams);
  CudaCheck(cudaEventRecord(fork_, main_), "cudaEventRecord (fork)");
  for (int i = 0; i < used; ++i) CudaCheck(cudaStreamWaitEvent(side_[i].stream, fork_, 0), "cudaStreamWaitEvent (fork)");
  for (int i = 0; i < n; ++i) {
    SideStream& sd = side_[i % kSideStreams];
    job(i, sd.stream, *sd.gemv_ws);
  }
  for (int i = 0; i < used; ++i) {
    CudaCheck(cudaEventRecord(side_[i].done, side_[i].stream), "cudaEventRecord (join)");
    CudaCheck(cudaStreamWaitEvent(main_, side_[i].done, 0), "cudaStreamWaitEvent (join)");
  }
}

}  // namespace dsmesh

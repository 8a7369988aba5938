// Independent launches of the CUDA backend overlapped on side streams (CudaBackendOptions::
// concurrent_linears): the streams, created on first use, each with its own EXL3 GEMV workspace (a workspace
// is bound to one stream), and the event fork and join that order them with the backend's stream, so that
// a graph capture records the jobs as parallel branches.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

#include "kernels/cuda/cuda_step_arena.h"
#include "kernels/cuda/exl3_gemv.h"

namespace dsmesh {

class SideStreams {
 public:
  // The side streams' GEMV workspaces take `gemv`.
  SideStreams(cudaStream_t main, const Exl3GemvTuning& gemv) : main_(main), gemv_tuning_(gemv) {}
  ~SideStreams();
  SideStreams(const SideStreams&) = delete;
  SideStreams& operator=(const SideStreams&) = delete;

  // Whether `requested` concurrent launches may overlap now: only inside a step whose temporaries fit the
  // arena (a temporary from the stream-ordered pool would be freed on the main stream while a side stream
  // may still read it). Requested but not possible (outside a step, or the arena nearly full) runs in
  // order, logged once.
  bool Allowed(bool requested, const StepArena& arena);
  // Runs job(i, stream, workspace) for i < n on side streams (each with its own GEMV workspace) that
  // start after the main stream's work so far; the main stream then waits for all of them.
  void Run(int n, const std::function<void(int, cudaStream_t, Exl3GemvWorkspace&)>& job);

 private:
  struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
    std::unique_ptr<Exl3GemvWorkspace> gemv_ws;
  };
  static constexpr int kSideStreams = 8;
  cudaStream_t main_;
  const Exl3GemvTuning gemv_tuning_;
  std::vector<SideStream> side_;  // created on first use
  cudaEvent_t fork_ = nullptr;
  bool logged_serial_ = false;  // concurrent linears requested but run in order was logged
};

}  // namespace dsmesh

// A device's queue of work, as it passes between layers that must not include that device's headers: the
// CUDA backend hands its stream to the worker's communicators, and neither common/ nor a CPU build sees
// cuda_runtime.h. `cuda_stream` is a cudaStream_t; nullptr is "no stream of its own" (the CPU backend's,
// or a CUDA device's default stream). Code that includes CUDA converts it with
// static_cast<cudaStream_t>(s.cuda_stream) at the one place it uses it.
#pragma once

namespace dsmesh {

struct DeviceStream {
  void* cuda_stream = nullptr;
};

}  // namespace dsmesh

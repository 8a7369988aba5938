// Programmatic dependent launch (PDL) for the decode chain's kernels (sm_90+).
//
// A kernel launched with the attribute cudaLaunchAttributeProgrammaticStreamSerialization may start
// before the kernel ahead of it in the stream has finished: once every CTA of that kernel has called
// PdlTrigger() (or exited). Its CTAs then run their prologue (index math, weight prefetch) while the
// predecessor drains, and PdlWait() blocks until the predecessor grid has completed and its memory is
// visible. Captured into a CUDA graph, such a launch becomes a programmatic edge.
//
// The rule every kernel launched through PdlLaunch follows: PdlWait() in every CTA before it reads
// anything an earlier kernel writes and before it writes anything (an earlier kernel may still read
// it); before the wait only weights, constant tables and its own arguments. Since each kernel waits
// for its predecessor's completion, and that one for its own, completion stays transitive along the
// stream. PdlTrigger() only decides how early the next kernel may start; it never makes data visible.
// Both are no-ops in a kernel launched without the attribute (the default path) and below sm_90.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "kernels/cuda/pdl_streams.h"

namespace dsmesh {

// Blocks until the grids this one depends on programmatically have completed and their writes are visible.
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// This CTA no longer holds back the launch of the next kernel in the stream (its prologue may start).
__device__ __forceinline__ void PdlTrigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A launch of `grid` x `block` with `smem` bytes on `s` carrying the PDL attribute (`attr` holds it, so it
// must outlive the launch), counted on the stream's counter.
inline cudaLaunchConfig_t PdlConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t s, cudaLaunchAttribute& attr,
                                    std::atomic<int64_t>& launches) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = s;
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  launches.fetch_add(1, std::memory_order_relaxed);
  return config;
}

// kernel<<<grid, block, smem, s>>>(args...), with the PDL attribute when the stream has PDL on
// (pdl_streams.h). Only for kernels that follow the rule above. Errors surface as for <<< >>>
// (cudaGetLastError).
template <class... Params, class... Args>
void PdlLaunch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  std::atomic<int64_t>* launches = PdlLaunchCounter(s);
  if (!launches) {
    kernel<<<grid, block, smem, s>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = PdlConfig(grid, block, smem, s, attr, *launches);
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// cudaLaunchKernel(kernel, ...) with the PDL attribute when the stream has PDL on: for launch sites that
// pick the kernel at run time as a `const void*`.
inline cudaError_t PdlLaunchKernel(const void* kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                   cudaStream_t s) {
  std::atomic<int64_t>* launches = PdlLaunchCounter(s);
  if (!launches) return cudaLaunchKernel(kernel, grid, block, args, smem, s);
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = PdlConfig(grid, block, smem, s, attr, *launches);
  return cudaLaunchKernelExC(&config, kernel, args);
}

}  // namespace dsmesh

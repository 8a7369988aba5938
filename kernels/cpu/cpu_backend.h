// The CPU backend: fp32 compute, dense weights kept as mmap'd bf16/fp16/f32 and converted in the inner
// loops, spread over the machine's cores (thread_pool.h). It is the reference the CUDA backend is
// checked against.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace dsmesh {

// threads > 0 sets the process-wide CPU thread count (thread_pool.h); <= 0 keeps it (default: all cores,
// or DSMESH_CPU_THREADS / OMP_NUM_THREADS).
std::shared_ptr<Backend> MakeCpuBackend(int threads = 0);

}  // namespace dsmesh

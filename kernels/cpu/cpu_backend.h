// The CPU backend: fp32 compute, dense weights kept as mmap'd bf16/fp16/f32 and converted in the inner
// loops, OpenMP across the machine's cores. It is the reference the CUDA backend is checked against.
#pragma once

#include <memory>

#include "model/backend.h"

namespace dsmesh {

// threads <= 0: OpenMP's default (all cores, or OMP_NUM_THREADS).
std::shared_ptr<Backend> MakeCpuBackend(int threads = 0);

}  // namespace dsmesh

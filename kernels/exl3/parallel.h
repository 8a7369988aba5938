// Chunked parallel loops for the EXL3 CPU kernels and the encoder, on the process's one CPU thread pool
// (kernels/cpu/thread_pool.h): ParallelFor splits [0, n) into contiguous chunks, one per thread, and the
// caller works too. Threads: cpu::CpuThreads() (--threads, else DSMESH_CPU_THREADS / OMP_NUM_THREADS,
// else the number of cores). A call made from inside a task runs inline, so nesting never deadlocks.
#pragma once

#include <cstdint>
#include <functional>

namespace dsmesh {

int Exl3ThreadCount();

// fn(begin, end, thread_index) for disjoint chunks covering [0, n); thread_index < Exl3ThreadCount().
// An exception thrown by fn is rethrown here (the first one) after every chunk has finished.
void Exl3ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

}  // namespace dsmesh

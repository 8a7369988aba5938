// A small persistent thread pool for the EXL3 CPU kernels and the encoder: ParallelFor splits [0, n)
// into contiguous chunks, one per thread, and the caller works too. Threads: DSMESH_CPU_THREADS if set (as the CPU backend),
// else std::thread::hardware_concurrency(). A call made while the pool is busy (from another thread or
// from inside a task) runs inline on the calling thread, so nesting never deadlocks.
#pragma once

#include <cstdint>
#include <functional>

namespace dsmesh {

int Exl3ThreadCount();

// fn(begin, end, thread_index) for disjoint chunks covering [0, n); thread_index < Exl3ThreadCount().
void Exl3ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

}  // namespace dsmesh

// The CPU backend's threads. ParallelFor hands out indices from an atomic counter; the calling thread
// works too and, at the end, waits only for indices other threads actually took. A worker that wakes up
// after everything was claimed just goes back to sleep, so on a shared machine a descheduled worker never
// holds up a step (an OpenMP barrier would wait for it).
#pragma once

#include <cstdint>
#include <functional>

namespace dsmesh {
namespace cpu {

// Process-wide number of threads ParallelFor may use, the caller included. Default: DSMESH_CPU_THREADS,
// else OMP_NUM_THREADS, else the number of cores.
int CpuThreads();
void SetCpuThreads(int threads);

// Runs body(i) for i in [0, n), in parallel when `work` (multiply-adds, roughly) is worth it and more
// than one thread is allowed. body must not throw. Calls from inside a body run serially.
void ParallelFor(int64_t n, int64_t work, const std::function<void(int64_t)>& body);

}  // namespace cpu
}  // namespace dsmesh

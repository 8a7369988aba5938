#include "kernels/exl3/parallel.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <mutex>

#include "kernels/cpu/thread_pool.h"

namespace dsmesh {

int Exl3ThreadCount() { return cpu::CpuThreads(); }

void Exl3ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  const int64_t chunks = std::min<int64_t>(Exl3ThreadCount(), n);
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  std::mutex mu;
  std::exception_ptr error;
  // The callers split only work worth splitting: no work threshold here (the largest value always splits).
  cpu::ParallelFor(chunks, std::numeric_limits<int64_t>::max(), [&](int64_t i) {
    const int64_t begin = n * i / chunks, end = n * (i + 1) / chunks;
    if (begin >= end) return;
    try {
      fn(begin, end, static_cast<int>(i));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace dsmesh

#include "kernels/exl3/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace dsmesh {
namespace {

class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  void Run(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock() || threads_ == 1 || n <= 1) {  // busy or nothing to split: run inline
      if (n > 0) fn(0, n, 0);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      pending_ = threads_ - 1;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    RunChunk(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void RunChunk(int index) {
    const int64_t begin = n_ * index / threads_, end = n_ * (index + 1) / threads_;
    if (begin >= end) return;
    try {
      (*fn_)(begin, end, index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void WorkerLoop(int index) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      RunChunk(index);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one parallel region at a time
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& ThePool() {
  static Pool* pool = [] {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    // The same knob as the CPU backend (kernels/cpu/thread_pool.h), so one setting governs every CPU pool.
    if (const char* env = std::getenv("DSMESH_CPU_THREADS")) n = std::atoi(env);
    return new Pool(std::clamp(n, 1, 256));  // leaked on purpose: no shutdown-order issues
  }();
  return *pool;
}

}  // namespace

int Exl3ThreadCount() { return ThePool().threads(); }

void Exl3ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) { ThePool().Run(n, fn); }

}  // namespace dsmesh

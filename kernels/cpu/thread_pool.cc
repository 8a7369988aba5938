#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace dsmesh {
namespace cpu {
namespace {

// Work below which an op stays on the calling thread: waking a worker costs microseconds, and only
// about a millisecond of work is worth it on a machine other processes share.
constexpr int64_t kParallelWork = int64_t{1} << 22;

thread_local bool in_parallel_body = false;

int DefaultThreads() {
  for (const char* var : {"DSMESH_CPU_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(var);
    if (v && std::atoi(v) > 0) return std::atoi(v);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::atomic<int> g_threads{0};

struct Job {
  const std::function<void(int64_t)>* body = nullptr;
  int64_t n = 0;
  int max_helpers = 0;              // workers allowed to join (threads - 1)
  std::atomic<int> helpers{0};
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Work() {
    in_parallel_body = true;
    for (;;) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) break;
      (*body)(i);
      done.fetch_add(1, std::memory_order_release);
    }
    in_parallel_body = false;
  }
};

class Pool {
 public:
  static Pool& Get() {
    static Pool* pool = new Pool();  // never destroyed: workers may still be parked at exit
    return *pool;
  }

  void Run(int64_t n, const std::function<void(int64_t)>& body, int threads) {
    std::lock_guard<std::mutex> one_at_a_time(run_mu_);
    EnsureWorkers(threads - 1);
    auto job = std::make_shared<Job>();
    job->body = &body;
    job->n = n;
    job->max_helpers = threads - 1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job;
      ++generation_;
    }
    cv_.notify_all();
    job->Work();
    // Wait only for indices other threads took and have not finished.
    for (int spins = 0; job->done.load(std::memory_order_acquire) < n; ++spins) {
      if (spins > 64) std::this_thread::yield();
    }
    std::lock_guard<std::mutex> lock(mu_);
    job_.reset();
  }

 private:
  void EnsureWorkers(int count) {
    while (static_cast<int>(workers_.size()) < count) workers_.emplace_back([this] { Loop(); });
  }

  void Loop() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      if (!job) continue;
      if (job->helpers.fetch_add(1) >= job->max_helpers) continue;
      job->Work();  // late arrivals find every index claimed and return at once
    }
  }

  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace

int CpuThreads() {
  int t = g_threads.load();
  if (t <= 0) {
    t = DefaultThreads();
    g_threads.store(t);
  }
  return t;
}

void SetCpuThreads(int threads) { g_threads.store(std::max(1, threads)); }

void ParallelFor(int64_t n, int64_t work, const std::function<void(int64_t)>& body) {
  const int threads = CpuThreads();
  if (n <= 1 || threads <= 1 || work <= kParallelWork || in_parallel_body) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  Pool::Get().Run(n, body, static_cast<int>(std::min<int64_t>(threads, n)));
}

}  // namespace cpu
}  // namespace dsmesh

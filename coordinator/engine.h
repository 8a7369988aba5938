// The coordinator's engine thread: forms the mesh (and re-forms it after a loss), then loops
// schedule -> send plan to every rank -> collect results -> stream tokens. Generate handlers submit
// requests from gRPC threads; everything the scheduler owns is guarded by one mutex that is NOT held
// while a step runs on the workers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/scheduler.h"
#include "coordinator/worker_mesh.h"

namespace dsmesh {

struct EngineConfig {
  SchedulerConfig scheduler;       // vocab/eos come from the model's config.json
  int block_size = 16;
  std::chrono::milliseconds register_timeout{120000};  // first formation only; then we wait as long as it takes
  std::chrono::milliseconds ready_timeout{600000};
  std::chrono::milliseconds step_timeout{600000};
  std::chrono::milliseconds drain_timeout{30000};
  // Admission, shared by every gateway: a Generate is refused (QueueFull) once max_num_seqs + max_queued
  // requests are running or waiting; a request's own GenerateRequest.max_queued (its gateway's flag) can
  // only lower the bound.
  int max_queued = 256;
  // Called (from the engine thread, no lock held) whenever the state line changes: `ready` is true
  // while the mesh is formed and serving. coordinator_main turns it into sd_notify READY=1 / STATUS=.
  std::function<void(bool ready, const std::string& status)> on_state;
};

// Submit() refuses a request the engine cannot take now (not ready, draining).
struct Unavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Submit() refuses a request beyond the admission bound (RESOURCE_EXHAUSTED, the gateway's 429).
struct QueueFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  Engine(const EngineConfig& config, WorkerMesh* mesh);

  // Runs until drained; returns the process exit code (0 after a drain, 1 when the first formation failed).
  int Run();
  // Throws std::invalid_argument, Unavailable, QueueFull.
  std::shared_ptr<Request> Submit(const GenerateRequest& req);
  // The request's client went away: the next plan frees its slot and KV blocks (counted in Stats).
  void Cancel(const std::shared_ptr<Request>& r);
  void Wake();
  void BeginDrain();
  StatsResponse Stats();
  bool ready();
  // The watchdog's health check: "" while the engine thread makes progress (its loop ran within
  // `max_stall`), or while it is blocked on the workers (a formation or a step) and the heartbeat
  // monitor still runs, since that monitor breaks the wait as soon as a rank stops answering. Waiting
  // for workers to (re)register is progress: the loop polls every 200 ms. Otherwise the reason.
  std::string Health(std::chrono::steady_clock::duration max_stall);

 private:
  bool FormMesh(bool first);   // false: give up (first formation timed out)
  void Step();
  void Fail(const std::string& reason);
  void Touch() { progress_ = std::chrono::steady_clock::now().time_since_epoch().count(); }
  void Announce(bool ready, const std::string& status);  // on_state, deduplicated
  struct WaitingOnWorkers;  // RAII: marks a Form()/RunStep() wait for Health()

  EngineConfig config_;
  WorkerMesh* mesh_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Scheduler> scheduler_;   // exists once the mesh has formed
  std::vector<std::shared_ptr<Request>> incoming_;
  bool ready_ = false;
  std::string not_ready_reason_ = "waiting for workers";
  std::string lost_reason_;  // "mesh lost: <why>" from a loss until the mesh is formed again
  std::atomic<bool> draining_{false};
  std::atomic<std::chrono::steady_clock::rep> progress_{std::chrono::steady_clock::now().time_since_epoch().count()};
  std::atomic<bool> waiting_on_workers_{false};
  std::mutex announce_mu_;
  std::string announced_;
  uint64_t next_seed_;
  // Admission and cancellation figures.
  int64_t rejected_ = 0;
  int64_t planned_steps_ = 0;  // plans with sequences built so far
  struct PendingCancel {
    std::shared_ptr<Request> r;
    int64_t planned_at_cancel;
  };
  std::vector<PendingCancel> pending_cancels_;
  int64_t cancelled_freed_ = 0;
  int64_t cancel_free_steps_max_ = 0;
  void CountCancelledFrees();  // mu_ held, after a Schedule()
  // Step time split (sums).
  int64_t steps_ = 0;
  StepTiming timing_sum_;
  double schedule_seconds_ = 0;
};

}  // namespace dsmesh

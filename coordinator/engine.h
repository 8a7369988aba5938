// The coordinator's engine thread: forms the mesh (and re-forms it after a loss), then loops
// schedule -> send plan to every rank -> collect results -> stream tokens. Generate handlers submit
// requests from gRPC threads; everything the scheduler owns is guarded by one mutex that is NOT held
// while a step runs on the workers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
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
};

// Submit() refuses a request the engine cannot take now (not ready, draining).
struct Unavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  Engine(const EngineConfig& config, WorkerMesh* mesh);

  // Runs until drained; returns the process exit code (0 after a drain, 1 when the first formation failed).
  int Run();
  std::shared_ptr<Request> Submit(const GenerateRequest& req);  // throws std::invalid_argument, Unavailable
  void Wake();
  void BeginDrain();
  StatsResponse Stats();
  bool ready();

 private:
  bool FormMesh(bool first);   // false: give up (first formation timed out)
  void Step();
  void Fail(const std::string& reason);

  EngineConfig config_;
  WorkerMesh* mesh_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Scheduler> scheduler_;   // exists once the mesh has formed
  std::vector<std::shared_ptr<Request>> incoming_;
  bool ready_ = false;
  std::string not_ready_reason_ = "waiting for workers";
  std::atomic<bool> draining_{false};
  uint64_t next_seed_;
  // Step time split (sums).
  int64_t steps_ = 0;
  StepTiming timing_sum_;
  double schedule_seconds_ = 0;
};

}  // namespace dsmesh

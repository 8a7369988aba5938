// Readiness of the mesh as the gateway sees it. A thread polls the coordinator's Stats RPC; the
// gateway is ready when the coordinator answers ready, is not draining, and the gateway's own event
// loop is responsive (a probe posted to it runs). Each passing check is also what feeds systemd's
// watchdog (WATCHDOG=1), so a wedged gateway or a lost coordinator stops the pings.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/mesh/mesh_client.h"

namespace dsmesh {

class MeshMonitor {
 public:
  // `loop_probe` returns true when the HTTP event loop ran a posted task within its own timeout.
  MeshMonitor(MeshClient* mesh, std::chrono::milliseconds interval, std::function<bool()> loop_probe);
  ~MeshMonitor();

  void Start();
  void Stop();
  void SetDraining() { draining_ = true; }

  bool ready() const;
  bool draining() const { return draining_; }
  std::string not_ready_reason() const;
  std::optional<StatsResponse> last_stats() const;

  // Called once, from the poll thread, the first time the gateway becomes ready.
  void OnFirstReady(std::function<void()> fn) { on_first_ready_ = std::move(fn); }

 private:
  void Loop();

  MeshClient* mesh_;
  const std::chrono::milliseconds interval_;
  std::function<bool()> loop_probe_;
  std::function<void()> on_first_ready_;
  std::atomic<bool> draining_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool ready_ = false;
  bool was_ready_ = false;
  std::string reason_ = "starting: coordinator not polled yet";
  std::optional<StatsResponse> stats_;
  std::thread thread_;
};

}  // namespace dsmesh

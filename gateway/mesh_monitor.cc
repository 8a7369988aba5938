#include "gateway/mesh_monitor.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/systemd_notify.h"

namespace dsmesh {

MeshMonitor::MeshMonitor(MeshClient* mesh, std::chrono::milliseconds interval, std::function<bool()> loop_probe)
    : mesh_(mesh), interval_(interval), loop_probe_(std::move(loop_probe)) {}

MeshMonitor::~MeshMonitor() { Stop(); }

void MeshMonitor::Start() { thread_ = std::thread([this] { Loop(); }); }

void MeshMonitor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool MeshMonitor::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_ && !draining_;
}

std::string MeshMonitor::not_ready_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) return "draining: the gateway is shutting down";
  return reason_;
}

std::optional<StatsResponse> MeshMonitor::last_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void MeshMonitor::Loop() {
  std::string last_reason;
  while (true) {
    std::string error;
    // At least 2 s: a busy coordinator on a loaded machine is slow to answer, not gone.
    auto stats = mesh_->TryStats(std::clamp(interval_ * 2, std::chrono::milliseconds(2000), std::chrono::milliseconds(5000)),
                              &error);
    bool loop_ok = loop_probe_ ? loop_probe_() : true;
    bool ready = false;
    std::string reason;
    if (!stats) {
      reason = "coordinator unreachable: " + error;
    } else if (!stats->ready()) {
      reason = "mesh not ready" + (stats->not_ready_reason().empty() ? "" : ": " + stats->not_ready_reason());
    } else if (stats->draining()) {
      reason = "mesh draining";
    } else if (!loop_ok) {
      reason = "gateway event loop unresponsive";
    } else {
      ready = true;
    }
    bool first_ready = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_ = ready;
      reason_ = reason;
      if (stats) stats_ = stats;
      if (ready && !was_ready_) first_ready = was_ready_ = true;
    }
    if (reason != last_reason) {
      if (ready) spdlog::info("mesh ready ({} ranks, max_model_len {}, max_num_seqs {})", stats->world(),
                              stats->max_model_len(), stats->max_num_seqs());
      else spdlog::warn("not ready: {}", reason);
      NotifyStatus(ready ? "serving" : reason);
      last_reason = reason;
    }
    if (first_ready && on_first_ready_) on_first_ready_();
    // The watchdog is fed only by a passing check: the gateway loop runs and the coordinator answers.
    if (stats && loop_ok) NotifyWatchdog();
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, interval_, [this] { return stop_; })) return;
  }
}

}  // namespace dsmesh

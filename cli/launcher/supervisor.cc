#include "cli/launcher/supervisor.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstring>

namespace dsmesh {

namespace {

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", ms.count() / 1000.0);
  return buf;
}

}  // namespace

Supervisor::Supervisor(LocalMesh* mesh, const SupervisorOptions& options)
    : mesh_(mesh),
      options_(options),
      policy_(options.limits),
      follower_(stderr),
      // The mesh's own credentials (its token, or its TLS certificates under `up --tls-*`).
      client_(mesh->coordinator_address(), mesh->credentials()) {}

int Supervisor::Run(const sigset_t& stop_signals) {
  for (const std::string& name : mesh_->ChildNames()) follower_.Follow(mesh_->log_path(name));
  mesh_->Start();
  std::string pids;
  for (const std::string& name : mesh_->ChildNames())
    pids += (pids.empty() ? "" : ", ") + name + " pid " + std::to_string(mesh_->pid(name));
  std::fprintf(stderr, "dsmesh up: started %s; their output is copied here and kept in %s\n", pids.c_str(),
               mesh_->log_path("NAME").c_str());
  std::fflush(stderr);
  ready_deadline_ = Clock::now() + options_.ready_timeout;
  next_poll_ = Clock::now();
  while (true) {
    follower_.Pump();
    const auto now = Clock::now();
    int status = 0;
    for (std::string dead; !(dead = mesh_->PollExited(&status)).empty();) {
      const int code = OnExit(dead, status, now);
      if (code >= 0) return code;
    }
    StartDueRestarts(now);
    const int code = CheckReady(now);
    if (code >= 0) return code;
    timespec ts{0, 100 * 1000 * 1000};
    const int sig = sigtimedwait(&stop_signals, nullptr, &ts);
    if (sig > 0) {
      if (!ever_ready_) return StopAll(130);
      std::fprintf(stderr, "dsmesh up: %s: stopping gateway, coordinator (drain) and workers\n", strsignal(sig));
      return StopAll(0, 30);
    }
  }
}

int Supervisor::OnExit(const std::string& name, int status, Clock::time_point now) {
  follower_.Pump(/*flush_partial=*/true);
  const std::string what = name + " " + DescribeStatus(status);
  switch (ClassifyExit(status)) {
    case ExitKind::kClean:
      std::fprintf(stderr, "dsmesh up: %s (stopped, not crashed, so it is not started again); stopping the others\n",
                   what.c_str());
      return StopAll(ExitCode(status) == 0 ? 1 : ExitCode(status));
    case ExitKind::kUsageError:
      std::fprintf(stderr, "dsmesh up: %s, a usage error or refusal (such as a model too large for the GPU) that a "
                           "restart would repeat; stopping the others\n",
                   what.c_str());
      PrintLastLines(name);
      return StopAll(ExitCode(status));
    case ExitKind::kFailure:
      break;
  }
  const auto delay = policy_.OnFailure(name, now);
  const RestartLimits& limits = policy_.limits();
  const std::string window = std::to_string(limits.window.count() / 1000) + " s";
  if (!delay) {
    std::fprintf(stderr, "dsmesh up: %s; it failed %d times within %s, so it is not started again; stopping "
                         "everything\n", what.c_str(), limits.max_failures, window.c_str());
    PrintLastLines(name);
    return StopAll(1);
  }
  std::fprintf(stderr, "dsmesh up: %s; starting it again in %s (failure %d of the %d within %s that stop `up`)\n",
               what.c_str(), Seconds(*delay).c_str(), policy_.RecentFailures(name, now), limits.max_failures,
               window.c_str());
  std::fflush(stderr);
  restart_at_[name] = now + *delay;
  return -1;
}

void Supervisor::StartDueRestarts(Clock::time_point now) {
  for (auto it = restart_at_.begin(); it != restart_at_.end();) {
    if (now < it->second) {
      ++it;
      continue;
    }
    mesh_->StartChild(it->first);
    ++restarts_;
    recovering_ = true;
    next_poll_ = now;
    std::fprintf(stderr, "dsmesh up: %s restarted as pid %d (restart %d of this `up`)\n", it->first.c_str(),
                 static_cast<int>(mesh_->pid(it->first)), restarts_);
    std::fflush(stderr);
    it = restart_at_.erase(it);
  }
}

int Supervisor::CheckReady(Clock::time_point now) {
  if ((ever_ready_ && !recovering_) || now < next_poll_) return -1;
  next_poll_ = now + std::chrono::milliseconds(200);
  bool ready = false;
  int64_t epoch = 0;
  try {
    StatsResponse s = client_.Stats(std::chrono::milliseconds(1000));
    ready = s.ready();
    epoch = s.mesh_epoch();
    not_ready_reason_ = s.not_ready_reason();
  } catch (const std::exception& e) {
    not_ready_reason_ = e.what();
  }
  if (ready && restart_at_.empty()) {
    if (!ever_ready_) {
      if (options_.ready_message) std::fprintf(stderr, "%s\n", options_.ready_message().c_str());
    } else {
      std::fprintf(stderr, "dsmesh up: serving again (mesh epoch %lld) after %d restart(s)\n", (long long)epoch,
                   restarts_);
    }
    std::fflush(stderr);
    ever_ready_ = true;
    recovering_ = false;
  } else if (!ever_ready_ && now > ready_deadline_) {
    std::fprintf(stderr, "dsmesh up: the mesh did not become ready: %s; stopping everything\n",
                 not_ready_reason_.c_str());
    return StopAll(1);
  }
  return -1;
}

void Supervisor::PrintLastLines(const std::string& name) {
  const std::string path = mesh_->log_path(name);
  const auto lines = LogFollower::LastLines(path, options_.last_lines);
  std::fprintf(stderr, "dsmesh up: the last %zu line(s) of %s's output (%s):\n", lines.size(), name.c_str(),
               path.c_str());
  for (const std::string& line : lines) std::fprintf(stderr, "  | %s\n", line.c_str());
  std::fflush(stderr);
}

int Supervisor::StopAll(int code, int grace_s) {
  mesh_->Stop(grace_s);
  follower_.Pump(/*flush_partial=*/true);
  return code;
}

}  // namespace dsmesh

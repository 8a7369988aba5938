#include "cli/launcher/restart_policy.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>

namespace dsmesh {

ExitKind ClassifyExit(int wait_status) {
  if (WIFEXITED(wait_status)) {
    if (WEXITSTATUS(wait_status) == 0) return ExitKind::kClean;
    if (WEXITSTATUS(wait_status) == 2) return ExitKind::kUsageError;
    return ExitKind::kFailure;
  }
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGPIPE) return ExitKind::kClean;
  }
  return ExitKind::kFailure;
}

void RestartPolicy::Forget(std::deque<Clock::time_point>* times, Clock::time_point now) const {
  while (!times->empty() && now - times->front() >= limits_.window) times->pop_front();
}

int RestartPolicy::RecentFailures(const std::string& name, Clock::time_point now) {
  auto& times = failures_[name];
  Forget(&times, now);
  return static_cast<int>(times.size());
}

std::optional<std::chrono::milliseconds> RestartPolicy::OnFailure(const std::string& name, Clock::time_point now) {
  auto& times = failures_[name];
  Forget(&times, now);
  times.push_back(now);
  const int n = static_cast<int>(times.size());
  if (n >= limits_.max_failures) return std::nullopt;
  std::chrono::milliseconds delay = limits_.first_backoff;
  for (int i = 1; i < n && delay < limits_.max_backoff; ++i) delay *= 2;
  return std::min(delay, limits_.max_backoff);
}

}  // namespace dsmesh

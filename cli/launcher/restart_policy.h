// When `dsmesh up` starts a dead child again, the way systemd's Restart=on-failure does: a child that
// failed (non-zero exit, or killed by a signal other than SIGTERM/SIGINT/SIGHUP/SIGPIPE) is started
// again after a backoff that doubles per recent failure; one that failed `max_failures` times within
// `window` is given up on. Exit status 2 (a usage error: the same flags fail the same way) and a clean
// exit are never restarted. Pure bookkeeping: the caller owns processes and clocks.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <string>

namespace dsmesh {

struct RestartLimits {
  int max_failures = 5;
  std::chrono::milliseconds window{60000};
  std::chrono::milliseconds first_backoff{500};
  std::chrono::milliseconds max_backoff{2000};
};

enum class ExitKind {
  kClean,       // exit 0, or SIGTERM/SIGINT/SIGHUP/SIGPIPE: stopped on purpose
  kUsageError,  // exit 2: restarting cannot help
  kFailure,     // anything else: restart
};

// Classifies a waitpid() status.
ExitKind ClassifyExit(int wait_status);

class RestartPolicy {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RestartPolicy(const RestartLimits& limits) : limits_(limits) {}

  // Records a failure of `name` at `now`. Returns how long to wait before starting it again, or nullopt
  // when this is its max_failures-th failure within the window (give up).
  std::optional<std::chrono::milliseconds> OnFailure(const std::string& name, Clock::time_point now);
  // Failures of `name` within the window ending at `now`.
  int RecentFailures(const std::string& name, Clock::time_point now);
  const RestartLimits& limits() const { return limits_; }

 private:
  void Forget(std::deque<Clock::time_point>* times, Clock::time_point now) const;

  const RestartLimits limits_;
  std::map<std::string, std::deque<Clock::time_point>> failures_;
};

}  // namespace dsmesh

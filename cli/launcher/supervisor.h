// `dsmesh up`'s watch over its children (a LocalMesh): starts them, copies their output (LOG_DIR/NAME.log)
// to stderr, waits for the mesh to be ready, and then keeps it up the way systemd's Restart=on-failure
// keeps a unit up (RestartPolicy): a child that fails is started again after a short backoff (a worker
// registers again and the coordinator re-forms the mesh at the next epoch; the gateway answers 503
// meanwhile); one that fails max_failures times within the window, exits with a usage error or exits
// cleanly stops `up`, with a message naming it and its last lines of output. Every start, failure and
// restart is one line on stderr.
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "cli/launcher/local_mesh.h"
#include "cli/launcher/log_follower.h"
#include "common/mesh/mesh_client.h"
#include "cli/launcher/restart_policy.h"

namespace dsmesh {

struct SupervisorOptions {
  RestartLimits limits;
  std::chrono::seconds ready_timeout{300};  // for the first readiness only
  // Printed once, when the mesh is first ready (made then: the coordinator's address is known only after
  // it started, LocalMesh::StartCoordinator).
  std::function<std::string()> ready_message;
  int last_lines = 20;                      // of a child's log, in the closing message
};

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;

  // `mesh` has a log_dir and is not started yet.
  Supervisor(LocalMesh* mesh, const SupervisorOptions& options);

  // Starts the mesh and supervises it until one of `stop_signals` arrives (stops everything in order;
  // returns 0 once the mesh was ready, 130 before) or a child stops `up` (returns non-zero).
  int Run(const sigset_t& stop_signals);

 private:
  // Handles the exit of `name`; returns -1 to go on, else the exit code of `up`.
  int OnExit(const std::string& name, int status, Clock::time_point now);
  void StartDueRestarts(Clock::time_point now);
  // Polls the coordinator while the mesh is not known to be ready; returns -1 or an exit code.
  int CheckReady(Clock::time_point now);
  int StopAll(int code, int grace_s = 10);
  void PrintLastLines(const std::string& name);

  LocalMesh* mesh_;
  const SupervisorOptions options_;
  RestartPolicy policy_;
  LogFollower follower_;
  MeshClient client_;
  std::map<std::string, Clock::time_point> restart_at_;  // children waiting out their backoff
  Clock::time_point ready_deadline_;
  Clock::time_point next_poll_;
  bool ever_ready_ = false;
  bool recovering_ = false;  // a child was restarted since the mesh was last seen ready
  std::string not_ready_reason_ = "no answer yet";
  int restarts_ = 0;
};

}  // namespace dsmesh

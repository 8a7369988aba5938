// Starts a coordinator and N CPU workers (and optionally the gateway) on this machine as child processes,
// for `dsmesh up`, `dsmesh logits/generate --world N` and the end-to-end tests. Children get SIGTERM if
// this process dies (PR_SET_PDEATHSIG), so nothing is orphaned; Stop() terminates them in order.
// StartChild() starts one again with the same flags (the coordinator keeps its port); `dsmesh up`'s
// Supervisor decides when.
//
// Every link is authenticated: without credentials in the options, the mesh uses this process's mesh
// token (a random one is made the first time), written to LOG_DIR/mesh-token (or a private temporary
// directory), mode 0600, and handed to every child with --mesh-token-file; this process's MeshClients
// send it by default.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/mesh/mesh_credentials.h"

namespace dsmesh {

struct LocalMeshOptions {
  std::string coordinator_bin, worker_bin, gateway_bin;  // gateway_bin empty: no gateway
  std::string model_dir;
  int world = 2;
  int coordinator_port = 0;     // 0: pick a free port
  int gateway_port = 8000;
  std::string kv_memory = "256M";  // every worker's --kv-memory; empty: each sizes its own (GPU: the device's share)
  std::string gpu_memory_utilization;  // every worker's --gpu-memory-utilization; empty: the worker's default (0.9)
  std::string device = "cpu";   // every worker's --device (cpu, cuda or cuda:N; several workers may share a GPU)
  int threads_per_worker = 1;
  bool enforce_eager = false;   // workers run every step eagerly (no CUDA graphs), as vLLM's --enforce-eager
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype for every worker
  std::vector<std::string> coordinator_args;  // extra flags, e.g. {"--max-num-seqs", "8"}
  // Bench only (`dsmesh bench --draft-acceptance`, coordinator/simulated_acceptance.h): per-position
  // acceptance rates such as "0.85,0.70,0.55". The coordinator gets --bench-draft-acceptance and every
  // worker --bench-simulated-acceptance (without which a worker refuses simulated plans); `dsmesh up`
  // never sets it.
  std::string bench_draft_acceptance;
  std::vector<std::string> gateway_args;      // extra flags, e.g. {"--api-key", "k", "--max-queued", "64"}
  std::string log_dir;          // empty: children inherit stderr; else they append to LOG_DIR/NAME.log
  MeshCredentials credentials;  // no token and no TLS: the process's token, in a file of the mesh's own
};

struct Child {
  std::string name;
  pid_t pid = -1;
  std::vector<std::string> argv;
};

class LocalMesh {
 public:
  explicit LocalMesh(const LocalMeshOptions& options);
  ~LocalMesh();  // Stop()

  void Start();
  std::string coordinator_address() const;
  // What every child is given (--mesh-token-file ...), and what a client of this mesh must send.
  const MeshCredentials& credentials() const { return opt_.credentials; }
  // Waits for any child to exit; returns its name and fills *status (-1 if none left).
  std::string WaitAny(int* status);
  // Returns the name of a child that has exited (without blocking), or "".
  std::string PollExited(int* status);
  // SIGTERM to everyone (gateway, coordinator, then workers), SIGKILL after `grace_s`.
  void Stop(int grace_s = 10);
  // Kill / restart one worker (fault tests).
  void KillWorker(int rank, int sig);
  void StartWorker(int rank);
  pid_t worker_pid(int rank) const;
  // Starts the named child again (after it exited and was reaped); throws if it is still running.
  void StartChild(const std::string& name);
  // The named child's pid, or -1 while it is not running.
  pid_t pid(const std::string& name) const;
  // "coordinator", "worker0".."worker<N-1>", then "gateway" when there is one; known before Start().
  std::vector<std::string> ChildNames() const;
  // Where the named child's output goes (LOG_DIR/NAME.log), or "" without a log_dir.
  std::string log_path(const std::string& name) const;
  // Waits up to timeout_s for the named child ("coordinator", "worker1", "gateway") to exit; returns its
  // wait status, or -1 on timeout / unknown child.
  int WaitExit(const std::string& name, int timeout_s);
  pid_t coordinator_pid() const { return children_.empty() ? -1 : children_[0].pid; }

  // The directory of the running executable (siblings are found relative to it).
  static std::string SelfDir();
  // A free TCP port on 127.0.0.1.
  static int FreePort();

 private:
  pid_t Spawn(const std::string& name, const std::vector<std::string>& argv);
  // The coordinator first, until it listens. A port FreePort chose can be taken by another process before
  // the coordinator binds it (the coordinator then exits at once: it never shares a port); the coordinator
  // is started again on another free port, up to 3 times. A port the caller gave is never replaced.
  void StartCoordinator();
  std::vector<std::string> WorkerArgv(int rank) const;
  std::vector<std::string> WithCredentials(std::vector<std::string> argv) const;
  Child& Find(const std::string& name);

  LocalMeshOptions opt_;
  bool port_chosen_here_ = false;  // coordinator_port came from FreePort
  std::string token_dir_;        // the private directory of the token file when there is no log_dir
  std::vector<Child> children_;  // [0] coordinator, [1..world] workers, [world+1] gateway
};

}  // namespace dsmesh

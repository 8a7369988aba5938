// The coordinator's view of its workers: one Session stream per rank (WorkerControl.Session), mesh
// formation (FormMesh -> WorkerReady from every rank), step fan-out and result collection, and loss
// detection: a session that closes (process died) or stops sending heartbeats (hung) breaks the mesh
// at once; whoever waits on it is woken with the reason. A worker on this machine gets its plans and
// returns its results over a step channel (common/mesh/step_channel.h) that the engine thread writes and
// reads itself; others use the Session stream for them too.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/mesh/rendezvous_store.h"
#include "common/mesh/step_channel.h"
#include "proto/mesh.grpc.pb.h"

namespace dsmesh {

// The mesh lost a rank (or a rank failed a step): the step cannot complete.
struct MeshBroken : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Every rank answered FormMesh but some reported an error (cannot load the model, cannot shard it at this
// world size, cannot reach its peers): retrying the same workers usually fails the same way.
struct FormationError : MeshBroken {
  using MeshBroken::MeshBroken;
};

struct StepTiming {
  double wall = 0, plan_send = 0, forward = 0, collectives = 0, sample = 0, result_return = 0;
  int64_t collective_calls = 0;
};

class WorkerMesh {
 public:
  using Stream = grpc::ServerReaderWriter<CoordinatorMessage, WorkerMessage>;

  WorkerMesh(int world, RendezvousStore* store, std::chrono::milliseconds heartbeat_timeout);
  ~WorkerMesh();

  // Body of the WorkerControl.Session RPC; returns when the worker goes away.
  grpc::Status Serve(grpc::ServerContext* ctx, Stream* stream);

  // Drafts per step the coordinator schedules (0: no speculation); sent in FormMesh so that the workers
  // report state sizes with the rollback rows and the MTP window included.
  void set_num_speculative_tokens(int k) { num_speculative_tokens_ = k; }
  // The drafts' vocabulary (FormMesh.draft_vocab_size; 0: the whole head).
  void set_draft_vocab_size(int64_t n) { draft_vocab_size_ = n; }
  // Sequence states each worker's state pool holds (FormMesh.state_slots).
  void set_state_slots(int n) { state_slots_ = n; }

  // Waits until every rank has a session. False on timeout (then MissingRanks() says which).
  bool WaitAllRegistered(std::chrono::milliseconds timeout);
  std::vector<int> MissingRanks();
  // Starts a new epoch and forms the mesh; returns every rank's WorkerReady. Throws MeshBroken naming
  // the rank(s) and reason when a rank is lost, reports an error, or does not answer within `timeout`.
  std::vector<WorkerReady> Form(std::chrono::milliseconds timeout);
  // Sends the plan to every rank and waits for all results. Throws MeshBroken.
  std::vector<StepResult> RunStep(StepPlan* plan, std::chrono::milliseconds timeout, StepTiming* timing);
  // Tells every connected rank to drop its state (after a failure) / to exit (shutdown).
  void ResetAll(const std::string& reason);
  void DrainAll();
  // Blocks until the mesh breaks or `timeout` passes (the engine's idle wait); returns the reason or "".
  std::string WaitBroken(std::chrono::milliseconds timeout);
  std::string broken_reason();
  int64_t epoch() const { return epoch_; }
  // Registrations for a rank that an earlier session (a worker process since gone) held: restarts.
  int64_t worker_restarts() const { return worker_restarts_; }
  int world() const { return world_; }
  std::map<int, WorkerStats> worker_stats();
  // When the heartbeat monitor last ran. While it runs, a rank that stops heartbeating breaks the mesh
  // within the heartbeat timeout and wakes whoever waits in Form()/RunStep(), so such a wait is bounded.
  std::chrono::steady_clock::time_point monitor_tick() const {
    return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(monitor_tick_ns_.load()));
  }

 private:
  int num_speculative_tokens_ = 0;
  int64_t draft_vocab_size_ = 0;
  int state_slots_ = 0;
  struct Session {
    ~Session();
    grpc::ServerContext* ctx = nullptr;
    Stream* stream = nullptr;
    WorkerHello hello;
    std::mutex write_mu;
    bool closed = false;
    std::chrono::steady_clock::time_point last_heard;
    std::map<int64_t, WorkerReady> ready;     // by epoch
    std::map<int64_t, StepResult> results;    // by step id
    // The step channel of this formation (-1: plans and results go on the stream). Used by the engine
    // thread only (Form connects it, RunStep writes and reads it).
    int step_fd = -1;
    FrameReader step_reader;
  };
  bool Write(const std::shared_ptr<Session>& s, const CoordinatorMessage& m);
  void Lose(int rank, const std::shared_ptr<Session>& s, const std::string& why);  // mu_ held
  void Monitor();
  // Connects each rank's result channel for this formation, where its worker offered one.
  void ConnectStepChannels(const std::vector<std::shared_ptr<Session>>& sessions, const std::string& prefix);
  // Waits until a result channel is readable, wake_fd_ is signalled or `timeout` passes, and files the
  // results read into their sessions; a channel that closes or carries garbage loses its rank.
  void WaitForResults(const std::vector<std::shared_ptr<Session>>& sessions, std::chrono::milliseconds timeout);
  // Closes rank `rank`'s step channel and, while `s` is still the rank's session, cuts it off and loses
  // the rank for `why`. mu_ held.
  void LoseStepChannel(int rank, const std::shared_ptr<Session>& s, const std::string& why);
  void Wake();  // signals wake_fd_

  const int world_;
  RendezvousStore* store_;
  const std::chrono::milliseconds heartbeat_timeout_;
  std::mutex mu_;
  // Membership changes: registrations, losses, stop (WaitAllRegistered, WaitBroken, Monitor).
  std::condition_variable cv_;
  // Formation replies: a Ready arrived, or a rank was lost (Form). Its own variable, so a reply wakes only
  // the thread waiting for it: not the monitor nor WaitBroken callers.
  std::condition_variable results_cv_;
  // RunStep's wake-up beside the step channels (an eventfd): a result on a stream, or a lost rank.
  int wake_fd_ = -1;
  std::vector<std::shared_ptr<Session>> ranks_;
  std::vector<bool> ever_registered_;  // by rank
  std::atomic<int64_t> worker_restarts_{0};
  std::string broken_;   // first loss since the last Form(); "" when intact
  int64_t epoch_ = 0;
  int64_t step_id_ = 0;
  std::map<int, WorkerStats> stats_;
  bool stop_ = false;
  std::atomic<std::chrono::steady_clock::rep> monitor_tick_ns_{std::chrono::steady_clock::now().time_since_epoch().count()};
  std::thread monitor_;
};

}  // namespace dsmesh

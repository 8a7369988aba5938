// One tensor-parallel rank's life with the coordinator: dials it, holds the Session stream (hello,
// heartbeats, results), joins the data-plane communicator and loads its shard when told to form the mesh,
// executes step plans (StepExecutor) and answers each with its result or its error (over the step channel
// of common/mesh/step_channel.h when the coordinator is on this machine), until drained or terminated. worker_main.cc parses the flags and runs it. On a GPU it first checks that its shard and KV pool
// fit the device's free memory (model/gpu_fit.h) and exits with status 2, naming both sizes, when they do not.
//
// Under systemd (Type=notify, deploy/systemd/dsmesh-worker@.service): READY=1 once its shard is loaded
// and it joined the mesh (the first FormMesh that succeeded), STATUS= on every change (registered,
// joined epoch E, mesh reset), STOPPING=1 when drained or terminated. WATCHDOG=1 only while the
// session with the coordinator is healthy (SessionHealth): the coordinator answered a heartbeat
// recently, or the worker is inside a step/formation that has not outlived its bound.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/communicator.h"
#include "common/flags.h"
#include "common/mesh/mesh_credentials.h"
#include "common/mesh/step_channel.h"
#include "model/kv_layout.h"
#include "model/model.h"
#include "proto/mesh.grpc.pb.h"
#include "worker/mesh_communicator.h"
#include "worker/step_executor.h"

namespace gloo::rendezvous {
class Store;
}

namespace dsmesh {

// dsmesh-worker's flags (the mesh credential flags included); throws UsageError for an unknown flag or a missing
// --rank / --world.
Flags ParseWorkerFlags(const std::vector<std::string>& args);

class Worker {
 public:
  // Reads the dsmesh-worker flags (see worker_main.cc); throws UsageError on a bad one.
  explicit Worker(const Flags& f);
  ~Worker();

  // Connects and serves the session until drained (0), terminated by SIGTERM/SIGINT (0), refused or
  // cut off by the coordinator (1). SIGTERM, SIGINT and SIGUSR1 must be blocked in every thread of the
  // process (BlockShutdownSignals) before it starts: a dedicated thread takes them with sigwait.
  int Run();

 private:
  static int64_t SteadyNow() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

  // "" while the session with the coordinator is healthy, else why not. Healthy: the coordinator
  // answered a heartbeat within `ack_limit` (clamped to [1 s, 5 s]; heartbeats go out every 250 ms).
  // Acks are read by the session's loop, which also runs mesh formations and the steps that come on the
  // stream, so during those they queue up; then the step itself is the evidence, for up to twice the
  // collective timeout: every wait on a peer inside it gives up after one collective timeout, so a step
  // older than that is wedged. (Steps on the step channel run on its own thread; acks flow meanwhile.)
  std::string SessionHealth(std::chrono::steady_clock::duration ack_limit);

  // RAII: marks the loop busy (a step or a formation) for SessionHealth().
  struct Busy {
    explicit Busy(Worker* w) : w_(w) { w_->busy_since_ = SteadyNow(); }
    ~Busy() { w_->busy_since_ = 0; }
    Worker* w_;
  };

  bool Send(const WorkerMessage& m);
  // Reads the coordinator's messages until the session ends; returns Run's exit code.
  int Loop();
  // Joins the mesh of `form` (loading the shard the first time) and answers Ready (or its error).
  void FormMesh(const dsmesh::FormMesh& form);
  // Gives the model the drafts' vocabulary of `form` (its draft_vocab_size while speculating, else the
  // whole head), logging a change. Throws on a size the model cannot take.
  void SetDraftVocabulary(const dsmesh::FormMesh& form);
  // Runs one plan (one at a time: step_mu_) and returns the message answering it, its result or the error
  // naming this rank. `channel`: the plan came on the step channel, which carries only plans of the epoch
  // this rank joined last (an older one's, left over from before a re-formation, is refused).
  WorkerMessage Step(const StepPlan& plan, bool channel);
  // Offers this formation's coordinator the step channel (its name under StepChannelKey in the store),
  // making the listener and starting ServeStepChannel the first time.
  void OfferStepChannel(gloo::rendezvous::Store& store);
  // The step channel's thread: takes the coordinator's newest connection (each formation connects anew),
  // reads plans from it, runs them and writes their results back, until step_channel_stop_fd_ is signalled.
  void ServeStepChannel();
  void StopStepChannel();
  // The data-plane communicator of this formation: CUDA IPC when every rank is a process on this one
  // GPU (NCCL refuses that, and Gloo would stage every activation through the host), else Gloo over TCP.
  // DSMESH_TP_COMM=gloo forces Gloo; =cuda-ipc fails loudly where it cannot be used. Every rank reads
  // the same UUIDs from the store, so all reach the same choice.
  std::unique_ptr<Communicator> MakeCommunicator(gloo::rendezvous::Store& store);
  // The GPU's KV budget without --kv-memory: what --gpu-memory-utilization of the device leaves after
  // everything already resident (this worker's weights, other processes on the same GPU).
  int64_t GpuKvBudget() const;

  int rank_, world_;
  std::string coordinator_;
  MeshCredentials credentials_;
  std::string model_dir_, device_, data_host_;
  bool enforce_eager_ = false;
  bool bench_simulated_acceptance_ = false;  // started by `dsmesh bench --draft-acceptance` (LocalMesh)
  KvCacheDtype kv_dtype_ = KvCacheDtype::kF32;  // --kv-cache-dtype: storage of entries and indexer keys
  int cuda_device_ = -1;
  double gpu_memory_utilization_ = 0.9;
  bool kv_budget_explicit_ = true;
  int threads_;
  std::chrono::milliseconds collective_timeout_;
  std::string comm_description_;  // which communicator this formation uses, for the startup line
  int64_t kv_budget_ = 0;
  MeshCommunicator comm_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<StepExecutor> executor_;
  std::shared_ptr<WorkerControl::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<WorkerMessage, CoordinatorMessage>> stream_;
  std::mutex write_mu_;
  std::atomic<bool> stop_{false}, terminated_{false};
  std::atomic<int64_t> last_ack_{0};     // steady_clock ticks of the last heartbeat ack
  std::atomic<int64_t> busy_since_{0};   // steady_clock ticks when the running step/formation began; 0: idle
  bool notified_ready_ = false;
  // Steps come and go over a step channel (common/mesh/step_channel.h) once the coordinator connected to
  // the one offered at formation; DSMESH_STEP_CHANNEL=off keeps them on the session stream.
  bool step_channel_enabled_ = true;
  std::unique_ptr<StepChannelListener> step_listener_;
  std::thread step_channel_thread_;
  int step_channel_stop_fd_ = -1;  // an eventfd: written to end ServeStepChannel
  // One step, formation or reset at a time: the session's thread (Loop) and the step channel's both run them.
  std::mutex step_mu_;
  int64_t formed_epoch_ = -1;  // the mesh epoch this rank joined last (-1: none, or reset since); step_mu_
};

}  // namespace dsmesh

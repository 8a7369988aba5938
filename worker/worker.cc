#include "worker/worker.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <cuda_runtime.h>

#include "common/program.h"
#include "common/systemd_notify.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/gpu_fit.h"
#include "worker/cuda_ipc_communicator.h"
#include "worker/gloo_communicator.h"
#include "worker/grpc_store.h"

namespace dsmesh {

Flags ParseWorkerFlags(const std::vector<std::string>& args) {
  Flags flags(args,
              WithMeshCredentialFlags({"rank", "world", "coordinator", "model", "device", "kv-memory", "kv-memory-fraction",
                                       "gpu-memory-utilization", "threads", "data-host", "collective-timeout-ms",
                                       "enforce-eager", "kv-cache-dtype", "bench-simulated-acceptance"}),
              {"enforce-eager", "bench-simulated-acceptance"});
  if (!flags.Has("rank") || !flags.Has("world")) throw UsageError("--rank and --world are required");
  return flags;
}
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t ParseBytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mul = unit.empty() || unit == "B" ? 1 : unit == "K" ? 1024.0 : unit == "M" ? 1048576.0 : unit == "G" ? 1073741824.0 : -1;
  if (s.empty() || mul < 0 || !(v > 0)) throw UsageError("--kv-memory: expected BYTES with optional K/M/G suffix, got " + s);
  return static_cast<int64_t>(v * mul);
}

int64_t MemAvailableBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  throw std::runtime_error("/proc/meminfo: no MemAvailable line");
}

// The local address peers can reach us at: the source address of a route towards the coordinator.
std::string LocalAddressToward(const std::string& coordinator) {
  std::string host = coordinator.substr(0, coordinator.rfind(':'));
  if (host == "localhost" || host.rfind("127.", 0) == 0) return "127.0.0.1";
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) throw std::runtime_error("cannot resolve " + host);
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  std::string out = "127.0.0.1";
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      out = inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

CudaBackendOptions CudaOptions(bool enforce_eager) {
  CudaBackendOptions o = CudaBackendOptionsFromEnvironment();  // DSMESH_CUDA_* / DSMESH_EXL3_* A/B variants and tuning
  o.cuda_graphs = !enforce_eager;
  return o;
}

}  // namespace

Worker::Worker(const Flags& f)
    : rank_(static_cast<int>(f.GetInt("rank", -1))),
      world_(static_cast<int>(f.GetInt("world", 0))),
      coordinator_(f.Require("coordinator")),
      credentials_(MeshCredentialsFromFlags(f)),
      model_dir_(f.Require("model")),
      device_(f.Get("device", "cpu")),
      threads_(static_cast<int>(f.GetInt("threads", 0))),
      collective_timeout_(f.GetInt("collective-timeout-ms", 30000)),
      comm_(rank_, world_) {
  if (world_ < 1) throw UsageError("--world must be >= 1");
  if (rank_ < 0 || rank_ >= world_) throw UsageError("--rank must be in [0, world)");
  try {
    cuda_device_ = ParseDeviceFlag(device_);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  if (cuda_device_ >= 0) {
    RequireCudaDevice(cuda_device_, "dsmesh-worker --device " + device_);
    device_ = "cuda:" + std::to_string(cuda_device_);
  }
  enforce_eager_ = f.Has("enforce-eager");
  bench_simulated_acceptance_ = f.Has("bench-simulated-acceptance");
  try {
    kv_dtype_ = ParseKvCacheDtype(f.Get("kv-cache-dtype", "auto"));
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  gpu_memory_utilization_ = f.GetDouble("gpu-memory-utilization", 0.9);
  if (!(gpu_memory_utilization_ > 0 && gpu_memory_utilization_ <= 1))
    throw UsageError("--gpu-memory-utilization must be in (0, 1]");
  if (f.Has("kv-memory") && f.Has("kv-memory-fraction")) throw UsageError("give --kv-memory or --kv-memory-fraction, not both");
  kv_budget_explicit_ = f.Has("kv-memory") || cuda_device_ < 0;
  kv_budget_ = f.Has("kv-memory") ? ParseBytes(f.Get("kv-memory"))
                                  : static_cast<int64_t>(f.GetDouble("kv-memory-fraction", 0.1) * MemAvailableBytes());
  data_host_ = f.Has("data-host") ? f.Get("data-host") : LocalAddressToward(coordinator_);
  const char* channel = std::getenv("DSMESH_STEP_CHANNEL");
  if (channel && std::string(channel) != "on" && std::string(channel) != "off")
    throw UsageError(std::string("DSMESH_STEP_CHANNEL=") + channel + ": expected on or off");
  step_channel_enabled_ = !channel || std::string(channel) == "on";
}

Worker::~Worker() { StopStepChannel(); }

void Worker::StopStepChannel() {
  if (step_channel_thread_.joinable()) {
    const uint64_t one = 1;
    while (write(step_channel_stop_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    step_channel_thread_.join();  // after the step it may be running
  }
  if (step_channel_stop_fd_ >= 0) close(step_channel_stop_fd_);
  step_channel_stop_fd_ = -1;
}

int Worker::Run() {
  // A model too large for the GPU is refused before anything is uploaded, with the sizes named; exit
  // status 2 tells `dsmesh up` (and systemd's RestartPreventExitStatus) that a restart would repeat it.
  if (cuda_device_ >= 0) {
    try {
      RequireModelFitsGpu(model_dir_, world_, cuda_device_, kv_budget_explicit_ ? kv_budget_ : 0, kv_dtype_,
                          /*settle_s=*/5);
    } catch (const ModelDoesNotFitGpu& e) {
      std::fprintf(stderr, "[worker %d] %s\n", rank_, e.what());
      NotifyStopping(std::string("refused: ") + e.what());
      return 2;
    } catch (const std::exception& e) {
      // An unreadable pack: the load at mesh formation reports it to the coordinator, as without a GPU.
      std::fprintf(stderr, "[worker %d] could not check that the model fits the GPU: %s\n", rank_, e.what());
    }
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto channel = MeshChannel(coordinator_, args, credentials_);
  // Waits in short slices: SIGTERM/SIGINT are blocked in this process (sigwait takes them once the session
  // runs), so a stop asked for while the coordinator is not up yet is seen here, not after 30 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    if (channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(200))) break;
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    const timespec now{0, 0};
    const int sig = sigtimedwait(&stop, nullptr, &now);
    if (sig > 0) {
      std::fprintf(stderr, "[worker %d] signal %d before the coordinator at %s answered: exiting\n", rank_, sig,
                   coordinator_.c_str());
      return 0;
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("cannot reach the coordinator at " + coordinator_ + " within 30 s");
  }
  stub_ = WorkerControl::NewStub(channel);
  stream_ = stub_->Session(&ctx_);

  WorkerMessage hello;
  auto* h = hello.mutable_hello();
  h->set_rank(rank_);
  h->set_world(world_);
  h->set_model_dir(model_dir_);
  h->set_device(device_);
  h->set_pid(getpid());
  h->set_host(data_host_);
  Send(hello);

  last_ack_ = SteadyNow();  // a new session gets one ack window to see its first answer
  NotifyStatus("connected to the coordinator at " + coordinator_ + " as rank " + std::to_string(rank_) + "/" +
               std::to_string(world_) + "; waiting for the mesh to form");
  std::thread heartbeat([this] {
    while (!stop_.load()) {
      WorkerMessage m;
      m.mutable_heartbeat()->set_unix_ns(NowNs());
      if (!Send(m)) break;
      for (int i = 0; i < 5 && !stop_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::thread signals([this] {
    const int sig = WaitShutdownSignal();
    if (sig != SIGUSR1) {
      std::fprintf(stderr, "[worker %d] signal %d: leaving after the current step\n", rank_, sig);
      NotifyStopping("terminated: leaving after the current step");
      terminated_ = true;
    }
    ctx_.TryCancel();
  });
  // The watchdog pinger: at half of WatchdogSec, one WATCHDOG=1 per passing SessionHealth().
  std::thread watchdog;
  if (auto interval = SystemdWatchdogInterval()) {
    const auto period = *interval / 2;
    watchdog = std::thread([this, period] {
      std::string last_problem;
      while (!stop_.load()) {
        const std::string problem = SessionHealth(period);
        if (problem.empty()) {
          NotifyWatchdog();
        } else if (problem != last_problem) {
          std::fprintf(stderr, "[worker %d] unhealthy, not pinging the systemd watchdog: %s\n", rank_, problem.c_str());
          NotifyStatus("unhealthy: " + problem);
        }
        last_problem = problem;
        for (auto slept = std::chrono::microseconds(0); slept < period && !stop_.load();
             slept += std::chrono::milliseconds(50))
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }

  int rc = Loop();
  StopStepChannel();
  stop_ = true;
  ctx_.TryCancel();
  heartbeat.join();
  if (watchdog.joinable()) watchdog.join();
  pthread_kill(signals.native_handle(), SIGUSR1);
  signals.join();
  return rc;
}

std::string Worker::SessionHealth(std::chrono::steady_clock::duration ack_limit) {
  ack_limit = std::clamp<std::chrono::steady_clock::duration>(ack_limit, std::chrono::seconds(1), std::chrono::seconds(5));
  const auto now = std::chrono::steady_clock::duration(SteadyNow());
  const auto since_ack = now - std::chrono::steady_clock::duration(last_ack_.load());
  if (since_ack <= ack_limit) return "";
  const int64_t busy = busy_since_.load();
  if (busy != 0 && now - std::chrono::steady_clock::duration(busy) <= 2 * collective_timeout_) return "";
  const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(since_ack).count();
  if (busy != 0)
    return "a step or mesh formation has run for more than " + std::to_string(2 * collective_timeout_.count()) + " ms";
  return "the coordinator at " + coordinator_ + " answered no heartbeat for " + std::to_string(ms) + " ms";
}

bool Worker::Send(const WorkerMessage& m) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return stream_->Write(m);
}

int Worker::Loop() {
  CoordinatorMessage msg;
  while (stream_->Read(&msg)) {
    switch (msg.kind_case()) {
      case CoordinatorMessage::kHeartbeatAck:
        last_ack_ = SteadyNow();
        break;
      case CoordinatorMessage::kReject:
        std::fprintf(stderr, "[worker %d] the coordinator refused registration: %s\n", rank_, msg.reject().c_str());
        return 1;
      case CoordinatorMessage::kForm: {
        Busy busy(this);
        std::lock_guard<std::mutex> lock(step_mu_);
        FormMesh(msg.form());
        break;
      }
      case CoordinatorMessage::kPlan:
        Send(Step(msg.plan(), /*channel=*/false));
        break;
      case CoordinatorMessage::kReset: {
        std::fprintf(stderr, "[worker %d] mesh reset: %s\n", rank_, msg.reset().reason().c_str());
        NotifyStatus("mesh reset (" + msg.reset().reason() + "); waiting for the mesh to re-form");
        std::lock_guard<std::mutex> lock(step_mu_);
        if (executor_) executor_->Reset();
        comm_.Detach();
        formed_epoch_ = -1;
        break;
      }
      case CoordinatorMessage::kDrain:
        std::fprintf(stderr, "[worker %d] drained by the coordinator; exiting\n", rank_);
        NotifyStopping("drained by the coordinator");
        return 0;
      default:
        break;
    }
    if (terminated_) return 0;
  }
  if (terminated_) return 0;
  grpc::Status st = stream_->Finish();
  if (st.error_code() == grpc::UNAUTHENTICATED) {
    std::fprintf(stderr, "[worker %d] the coordinator at %s refused this worker (UNAUTHENTICATED): %s\n", rank_,
                 coordinator_.c_str(), st.error_message().c_str());
    return 1;
  }
  std::fprintf(stderr, "[worker %d] lost the coordinator at %s: %s\n", rank_, coordinator_.c_str(),
               st.ok() ? "stream closed" : st.error_message().c_str());
  return 1;
}

void Worker::FormMesh(const dsmesh::FormMesh& form) {
  WorkerMessage reply;
  auto* ready = reply.mutable_ready();
  ready->set_epoch(form.epoch());
  try {
    comm_.Detach();
    if (executor_) executor_->Reset();
    formed_epoch_ = -1;
    GrpcStore store(stub_, form.store_prefix());
    OfferStepChannel(store);
    std::unique_ptr<Communicator> comm = MakeCommunicator(store);
    auto* ipc = dynamic_cast<CudaIpcCommunicator*>(comm.get());
    comm_.Attach(std::move(comm));
    if (!model_) {
      std::shared_ptr<Backend> backend =
          cuda_device_ >= 0 ? MakeCudaBackend(cuda_device_, CudaOptions(enforce_eager_)) : MakeCpuBackend(threads_);
      model_ = LoadModel(model_dir_, ShardSpec{rank_, world_}, backend, &comm_);
      // The drafts' head is device memory too: loaded before the KV budget is taken from what is left.
      SetDraftVocabulary(form);
      if (!kv_budget_explicit_) kv_budget_ = GpuKvBudget();
      executor_ = std::make_unique<StepExecutor>(model_.get(), &comm_);
      executor_->set_tokenizer_dir(model_dir_);
      executor_->set_simulated_acceptance_allowed(bench_simulated_acceptance_);
      if (bench_simulated_acceptance_)
        std::fprintf(stderr, "[worker %d/%d] bench mode: steps may simulate draft acceptance (not for serving)\n",
                     rank_, world_);
      std::fprintf(stderr, "[worker %d/%d] weights: %s\n", rank_, world_, model_->WeightsDescription().c_str());
      const auto& c = model_->config();
      const int64_t per_token = model_->StateBytesPerToken();
      std::fprintf(stderr,
                   "[worker %d/%d] holds %d layers + %d MTP of %s, %.1f MiB of weights (shard %d/%d), KV budget "
                   "%.1f MiB (%lld bytes/token + %lld fixed bytes/sequence, ~%lld tokens); backend %s, "
                   "communicator %s\n",
                   rank_, world_, c.num_layers, c.num_mtp_layers, model_dir_.c_str(), model_->WeightBytes() / 1048576.0,
                   rank_, world_, kv_budget_ / 1048576.0, (long long)per_token,
                   (long long)model_->StateFixedBytes(), (long long)(kv_budget_ / std::max<int64_t>(per_token, 1)),
                   model_->backend().name().c_str(), comm_description_.c_str());
    }
    // The IPC collectives run on the backend's stream, behind the kernels that produce their buffers
    // (on the first formation the communicator exists before the backend; later ones are new objects).
    if (ipc) ipc->set_stream(CudaBackendStream(model_->backend()));
    SetDraftVocabulary(form);  // a later formation of another coordinator may ask for another one
    const int spec = form.num_speculative_tokens();
    if (spec > 0 && !model_->has_mtp())
      throw std::runtime_error("speculative decoding (method mtp) needs an MTP block, and " + model_dir_ +
                               " has none (no mtp.0.* tensors)");
    // The whole KV budget becomes the state pool now; the coordinator plans its blocks and slots.
    StatePoolOptions pool_options;
    pool_options.bytes = kv_budget_;
    pool_options.slots = form.state_slots();
    pool_options.max_speculative_tokens = spec;
    pool_options.external = form.state_slots() > 0;
    pool_options.kv_dtype = kv_dtype_;
    const StatePool& pool = model_->ConfigureStatePool(pool_options);
    std::fprintf(stderr, "[worker %d/%d] %s\n", rank_, world_, pool.Describe().c_str());
    ready->set_kv_pool_blocks(pool.num_blocks());
    ready->set_kv_block_tokens(pool.block_tokens());
    ready->set_kv_state_slots(pool.num_slots());
    ready->set_kv_block_bytes(pool.block_bytes());
    ready->set_weight_bytes(model_->WeightBytes());
    ready->set_kv_budget_bytes(kv_budget_);
    ready->set_state_bytes_per_token(model_->StateBytesPerToken());
    ready->set_state_fixed_bytes(model_->StateFixedBytes(spec));
    ready->set_vocab_size(static_cast<int32_t>(model_->config().vocab_size));
    ready->set_eos_token_id(static_cast<int32_t>(model_->config().eos_token_id));
    ready->set_summary("rank " + std::to_string(rank_) + " device " + device_ + " backend " + model_->backend().name());
    const std::string status = "joined mesh epoch " + std::to_string(form.epoch()) + " as rank " + std::to_string(rank_) +
                               "/" + std::to_string(world_) + "; shard loaded (" +
                               std::to_string(model_->WeightBytes() >> 20) + " MiB of weights), backend " +
                               model_->backend().name();
    formed_epoch_ = form.epoch();
    // READY=1 once: the shard is loaded and the rank is part of a mesh. Later re-formations only
    // update STATUS. (Sent before the reply; the coordinator's READY follows every rank's reply.)
    if (!notified_ready_) {
      notified_ready_ = true;
      NotifyReady(status);
    } else {
      NotifyStatus(status);
    }
  } catch (const std::exception& e) {
    comm_.Detach();
    ready->set_error(e.what());
    NotifyStatus(std::string("could not join mesh epoch ") + std::to_string(form.epoch()) + ": " + e.what());
    std::fprintf(stderr, "[worker %d] could not join mesh epoch %lld: %s\n", rank_, (long long)form.epoch(), e.what());
  }
  Send(reply);
}

void Worker::SetDraftVocabulary(const dsmesh::FormMesh& form) {
  const int64_t want = form.num_speculative_tokens() > 0 ? form.draft_vocab_size() : 0;
  const int64_t before = model_->draft_vocab_size();
  const int64_t now = model_->SetDraftVocabulary(want);
  if (now != before)
    std::fprintf(stderr, "[worker %d/%d] drafts over ids < %lld of %lld (draft_vocab_size %lld); weights: %s\n", rank_,
                 world_, static_cast<long long>(now), static_cast<long long>(model_->config().vocab_size),
                 static_cast<long long>(want), model_->WeightsDescription().c_str());
}

WorkerMessage Worker::Step(const StepPlan& plan, bool channel) {
  const int64_t received = NowNs();
  Busy busy(this);
  std::lock_guard<std::mutex> lock(step_mu_);
  StepResult result;
  try {
    if (!executor_ || !comm_.attached()) throw std::runtime_error("step plan before the mesh was formed");
    if (channel && plan.epoch() != formed_epoch_)
      throw std::runtime_error("step plan of mesh epoch " + std::to_string(plan.epoch()) +
                               ", but this rank is in epoch " + std::to_string(formed_epoch_));
    result = executor_->Run(plan);
  } catch (const std::exception& e) {
    result.Clear();
    result.set_step_id(plan.step_id());
    result.set_rank(rank_);
    result.set_error(std::string("rank ") + std::to_string(rank_) + ": " + e.what());
    std::fprintf(stderr, "[worker %d] step %lld failed: %s\n", rank_, (long long)plan.step_id(), e.what());
  }
  result.set_plan_received_unix_ns(received);
  result.set_result_sent_unix_ns(NowNs());
  WorkerMessage m;
  *m.mutable_result() = std::move(result);
  return m;
}

void Worker::OfferStepChannel(gloo::rendezvous::Store& store) {
  if (!step_channel_enabled_) return;
  if (!step_listener_) {
    try {
      step_listener_ = std::make_unique<StepChannelListener>();
      step_channel_stop_fd_ = eventfd(0, EFD_CLOEXEC);
      if (step_channel_stop_fd_ < 0) throw std::runtime_error("eventfd failed");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[worker %d] steps stay on the session stream: %s\n", rank_, e.what());
      step_listener_.reset();
      step_channel_enabled_ = false;
      return;
    }
    step_channel_thread_ = std::thread([this] { ServeStepChannel(); });
  }
  const std::string& name = step_listener_->name();
  store.set(StepChannelKey(rank_), std::vector<char>(name.begin(), name.end()));
}

void Worker::ServeStepChannel() {
  // The current CUDA device is per thread: steps on this thread run on the worker's device, as on the
  // session's thread (which chose it before the backend was made).
  if (cuda_device_ >= 0) cudaSetDevice(cuda_device_);
  int conn = -1;
  FrameReader reader;
  for (;;) {
    pollfd fds[3] = {{step_channel_stop_fd_, POLLIN, 0}, {step_listener_->fd(), POLLIN, 0}, {conn, POLLIN, 0}};
    if (poll(fds, conn >= 0 ? 3 : 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "[worker %d] step channel: poll failed: %s\n", rank_, std::strerror(errno));
      break;
    }
    if (fds[0].revents) break;
    if (fds[1].revents) {
      const int fd = step_listener_->AcceptNewest();
      if (fd >= 0) {  // a new formation's connection: whatever the last one still held is dropped
        if (conn >= 0) close(conn);
        conn = fd;
        reader = FrameReader();
        continue;
      }
    }
    if (conn < 0 || !fds[2].revents) continue;
    std::vector<std::string> frames;
    bool open = reader.ReadAvailable(conn, &frames) == FrameReader::Status::kOpen;
    for (const std::string& f : frames) {
      CoordinatorMessage msg;
      if (!msg.ParseFromString(f) || !msg.has_plan()) {
        std::fprintf(stderr, "[worker %d] step channel: not a step plan; closing it\n", rank_);
        open = false;
        break;
      }
      if (!WriteFrame(conn, Step(msg.plan(), /*channel=*/true).SerializeAsString())) {
        open = false;
        break;
      }
      if (terminated_) break;  // leaving after the current step; the session's end stops this thread
    }
    if (!open) {
      close(conn);
      conn = -1;
    }
  }
  if (conn >= 0) close(conn);
}

std::unique_ptr<Communicator> Worker::MakeCommunicator(gloo::rendezvous::Store& store) {
  const char* env = std::getenv("DSMESH_TP_COMM");
  const std::string want = env ? env : "";
  if (!want.empty() && want != "gloo" && want != "cuda-ipc")
    throw std::runtime_error("DSMESH_TP_COMM=" + want + ": expected gloo or cuda-ipc");
  if (want != "gloo" && world_ > 1) {
    std::string why;
    if (CudaIpcCommunicator::RanksShareOneDevice(store, "device_of_rank", rank_, world_, cuda_device_, &why)) {
      comm_description_ = "cuda-ipc on device " + std::to_string(cuda_device_);
      return std::make_unique<CudaIpcCommunicator>(rank_, world_, store, cuda_device_, collective_timeout_);
    }
    if (want == "cuda-ipc") throw std::runtime_error("DSMESH_TP_COMM=cuda-ipc cannot be used: " + why);
  }
  comm_description_ = "gloo/tcp at " + data_host_;
  return std::make_unique<GlooCommunicator>(rank_, world_, store, data_host_, collective_timeout_);
}

int64_t Worker::GpuKvBudget() const {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) throw std::runtime_error("cudaMemGetInfo failed");
  const double allowed = gpu_memory_utilization_ * static_cast<double>(total_b);
  const double used = static_cast<double>(total_b - free_b);
  if (allowed <= used)
    throw std::runtime_error("--gpu-memory-utilization " + std::to_string(gpu_memory_utilization_) + " of " +
                             std::to_string(total_b >> 20) + " MiB leaves no KV memory: " +
                             std::to_string(static_cast<int64_t>(used) >> 20) + " MiB are already in use");
  return static_cast<int64_t>(allowed - used);
}

}  // namespace dsmesh

#include "coordinator/worker_mesh.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace dsmesh {
namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
std::string Describe(int rank, const WorkerHello& h) {
  return "worker rank " + std::to_string(rank) + " (pid " + std::to_string(h.pid()) + " on " + h.host() + ")";
}
}  // namespace

WorkerMesh::WorkerMesh(int world, RendezvousStore* store, std::chrono::milliseconds heartbeat_timeout)
    : world_(world), store_(store), heartbeat_timeout_(heartbeat_timeout), ranks_(world), ever_registered_(world) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
  monitor_ = std::thread([this] { Monitor(); });
}

WorkerMesh::Session::~Session() {
  if (step_fd >= 0) close(step_fd);
}

void WorkerMesh::Wake() {
  const uint64_t one = 1;
  while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

WorkerMesh::~WorkerMesh() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  monitor_.join();
  close(wake_fd_);
}

void WorkerMesh::Lose(int rank, const std::shared_ptr<Session>& s, const std::string& why) {
  if (ranks_[rank] != s) return;
  ranks_[rank].reset();
  const std::string reason = Describe(rank, s->hello) + " " + why;
  std::fprintf(stderr, "[coordinator] %s\n", reason.c_str());
  if (broken_.empty()) broken_ = reason;
  cv_.notify_all();
  results_cv_.notify_all();
  Wake();
}

void WorkerMesh::Monitor() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    monitor_tick_ns_ = now.time_since_epoch().count();
    for (int r = 0; r < world_; ++r) {
      auto s = ranks_[r];
      if (s && now - s->last_heard > heartbeat_timeout_) {
        s->ctx->TryCancel();
        Lose(r, s, "stopped answering (no heartbeat for " + std::to_string(heartbeat_timeout_.count()) + " ms)");
      }
    }
  }
}

bool WorkerMesh::Write(const std::shared_ptr<Session>& s, const CoordinatorMessage& m) {
  std::lock_guard<std::mutex> lock(s->write_mu);
  return !s->closed && s->stream->Write(m);
}

grpc::Status WorkerMesh::Serve(grpc::ServerContext* ctx, Stream* stream) {
  WorkerMessage msg;
  if (!stream->Read(&msg) || !msg.has_hello()) return grpc::Status(grpc::INVALID_ARGUMENT, "first message must be hello");
  auto s = std::make_shared<Session>();
  s->ctx = ctx;
  s->stream = stream;
  s->hello = msg.hello();
  s->last_heard = std::chrono::steady_clock::now();
  const int rank = s->hello.rank();
  {
    std::string reject;
    std::unique_lock<std::mutex> lock(mu_);
    if (s->hello.world() != world_) {
      reject = "world " + std::to_string(s->hello.world()) + " does not match the coordinator's --world " +
               std::to_string(world_);
    } else if (rank < 0 || rank >= world_) {
      reject = "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_) + ")";
    } else if (ranks_[rank]) {
      reject = "rank " + std::to_string(rank) + " is already held by " + Describe(rank, ranks_[rank]->hello);
    }
    if (!reject.empty()) {
      lock.unlock();
      CoordinatorMessage m;
      m.set_reject(reject);
      stream->Write(m);
      std::fprintf(stderr, "[coordinator] refused a worker: %s\n", reject.c_str());
      return grpc::Status(grpc::FAILED_PRECONDITION, reject);
    }
    ranks_[rank] = s;
    const bool again = ever_registered_[rank];
    ever_registered_[rank] = true;
    if (again) ++worker_restarts_;
    std::fprintf(stderr, "[coordinator] %s registered%s (device %s)\n", Describe(rank, s->hello).c_str(),
                 again ? " again" : "", s->hello.device().c_str());
  }
  cv_.notify_all();

  while (stream->Read(&msg)) {
    if (msg.has_heartbeat()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        s->last_heard = std::chrono::steady_clock::now();
      }
      // Answer it (outside mu_: a write may wait on flow control): the worker pings systemd's watchdog
      // only while its heartbeats are answered.
      CoordinatorMessage ack;
      *ack.mutable_heartbeat_ack() = msg.heartbeat();
      Write(s, ack);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      s->last_heard = std::chrono::steady_clock::now();
      if (msg.has_ready()) {
        s->ready[msg.ready().epoch()] = msg.ready();
      } else if (msg.has_result()) {
        s->results[msg.result().step_id()] = std::move(*msg.mutable_result());
      } else {
        continue;
      }
    }
    // After unlocking: the woken engine thread takes mu_ at once instead of blocking on it again.
    if (msg.has_ready()) results_cv_.notify_all();
    else Wake();
  }
  {
    std::lock_guard<std::mutex> lock(s->write_mu);
    s->closed = true;
  }
  std::lock_guard<std::mutex> lock(mu_);
  Lose(rank, s, "disconnected");
  return grpc::Status::OK;
}

bool WorkerMesh::WaitAllRegistered(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    for (const auto& s : ranks_)
      if (!s) return false;
    return true;
  });
}

std::vector<int> WorkerMesh::MissingRanks() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if (!ranks_[r]) out.push_back(r);
  return out;
}

std::vector<WorkerReady> WorkerMesh::Form(std::chrono::milliseconds timeout) {
  std::vector<std::shared_ptr<Session>> sessions;
  CoordinatorMessage m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int r = 0; r < world_; ++r) {
      if (!ranks_[r]) throw MeshBroken("worker rank " + std::to_string(r) + " is not connected");
      sessions.push_back(ranks_[r]);
    }
    broken_.clear();
    ++epoch_;
    const std::string prefix = "epoch/" + std::to_string(epoch_) + "/";
    store_->ClearExcept(prefix);
    m.mutable_form()->set_epoch(epoch_);
    m.mutable_form()->set_store_prefix(prefix);
    m.mutable_form()->set_num_speculative_tokens(num_speculative_tokens_);
    m.mutable_form()->set_draft_vocab_size(draft_vocab_size_);
    m.mutable_form()->set_state_slots(state_slots_);
  }
  std::fprintf(stderr, "[coordinator] forming mesh epoch %lld with %d ranks\n", (long long)epoch_, world_);
  for (int r = 0; r < world_; ++r)
    if (!Write(sessions[r], m)) throw MeshBroken("worker rank " + std::to_string(r) + " went away during formation");
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t epoch = epoch_;
  auto done = [&] {
    if (!broken_.empty()) return true;
    for (const auto& s : sessions)
      if (!s->ready.count(epoch)) return false;
    return true;
  };
  if (!results_cv_.wait_for(lock, timeout, done)) {
    std::string missing;
    for (int r = 0; r < world_; ++r)
      if (!sessions[r]->ready.count(epoch)) missing += " " + std::to_string(r);
    throw MeshBroken("ranks" + missing + " did not join mesh epoch " + std::to_string(epoch) + " within " +
                     std::to_string(timeout.count() / 1000) + " s");
  }
  if (!broken_.empty()) throw MeshBroken(broken_);
  std::vector<WorkerReady> out;
  std::string errors;
  for (int r = 0; r < world_; ++r) {
    out.push_back(sessions[r]->ready[epoch]);
    if (!out.back().error().empty()) errors += "rank " + std::to_string(r) + ": " + out.back().error() + "; ";
    WorkerStats& st = stats_[r];
    st.set_rank(r);
    st.set_device(sessions[r]->hello.device());
    st.set_weight_bytes(out.back().weight_bytes());
  }
  if (!errors.empty()) throw FormationError("mesh epoch " + std::to_string(epoch) + " failed to form: " + errors);
  const std::string prefix = "epoch/" + std::to_string(epoch) + "/";
  lock.unlock();
  ConnectStepChannels(sessions, prefix);
  return out;
}

void WorkerMesh::ConnectStepChannels(const std::vector<std::shared_ptr<Session>>& sessions,
                                       const std::string& prefix) {
  int connected = 0;
  for (int r = 0; r < world_; ++r) {
    Session& s = *sessions[r];
    if (s.step_fd >= 0) close(s.step_fd);  // the last formation's
    s.step_fd = -1;
    s.step_reader = FrameReader();
    const std::optional<std::string> name = store_->Find(prefix + StepChannelKey(r));
    if (!name) continue;  // the worker offered none (DSMESH_STEP_CHANNEL=off, or it could not listen)
    std::string why;
    s.step_fd = ConnectStepChannel(*name, s.hello.pid(), &why);
    if (s.step_fd >= 0) {
      ++connected;
    } else {
      std::fprintf(stderr, "[coordinator] rank %d runs its steps over its session stream: %s\n", r, why.c_str());
    }
  }
  std::fprintf(stderr, "[coordinator] %d of %d ranks run their steps over a local step channel\n", connected, world_);
}

void WorkerMesh::WaitForResults(const std::vector<std::shared_ptr<Session>>& sessions,
                                std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}};
  std::vector<int> rank_of;  // fds[i + 1] is rank_of[i]'s channel
  for (int r = 0; r < world_; ++r)
    if (sessions[r]->step_fd >= 0) {
      fds.push_back({sessions[r]->step_fd, POLLIN, 0});
      rank_of.push_back(r);
    }
  const int n = poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(1, timeout.count())));
  if (n <= 0) return;  // timeout or EINTR: the caller checks its deadline
  if (fds[0].revents) {
    uint64_t count;
    while (read(wake_fd_, &count, sizeof(count)) < 0 && errno == EINTR) {
    }
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    const int r = rank_of[i - 1];
    const std::shared_ptr<Session>& s = sessions[r];
    std::vector<std::string> frames;
    const FrameReader::Status st = s->step_reader.ReadAvailable(s->step_fd, &frames);
    std::string problem = st == FrameReader::Status::kClosed ? "disconnected (its step channel closed)"
                          : st == FrameReader::Status::kBad ? "sent an oversized frame on its step channel"
                                                              : "";
    std::vector<StepResult> results;
    for (const std::string& f : frames) {
      WorkerMessage m;
      if (!m.ParseFromString(f) || !m.has_result()) {
        problem = "sent a malformed message on its step channel";
        break;
      }
      results.push_back(std::move(*m.mutable_result()));
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (StepResult& res : results) s->results[res.step_id()] = std::move(res);
    if (!problem.empty()) LoseStepChannel(r, s, problem);
  }
}

void WorkerMesh::LoseStepChannel(int rank, const std::shared_ptr<Session>& s, const std::string& why) {
  close(s->step_fd);
  s->step_fd = -1;
  // A worker process that died closes its session too. One that is alive but broke the channel is cut off,
  // so that it registers again and the mesh re-forms. (While the session is the rank's, its handler has not
  // returned: ctx is alive.)
  if (ranks_[rank] != s) return;
  s->ctx->TryCancel();
  Lose(rank, s, why);
}

std::vector<StepResult> WorkerMesh::RunStep(StepPlan* plan, std::chrono::milliseconds timeout, StepTiming* timing) {
  std::vector<std::shared_ptr<Session>> sessions;
  CoordinatorMessage m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) throw MeshBroken(broken_);
    for (int r = 0; r < world_; ++r) {
      if (!ranks_[r]) throw MeshBroken("worker rank " + std::to_string(r) + " is not connected");
      sessions.push_back(ranks_[r]);
    }
    plan->set_step_id(++step_id_);
    plan->set_epoch(epoch_);
  }
  const auto t0 = std::chrono::steady_clock::now();
  plan->set_sent_unix_ns(NowNs());
  *m.mutable_plan() = *plan;  // one copy, written to every rank
  std::string frame;
  for (int r = 0; r < world_; ++r) {
    const std::shared_ptr<Session>& s = sessions[r];
    if (s->step_fd < 0) {
      if (!Write(s, m)) throw MeshBroken("could not send step plan to worker rank " + std::to_string(r));
      continue;
    }
    if (frame.empty()) frame = m.SerializeAsString();
    if (!WriteFrame(s->step_fd, frame)) {  // the worker's end is closed: its process is gone
      std::lock_guard<std::mutex> lock(mu_);
      LoseStepChannel(r, s, "disconnected (its step channel closed)");
      throw MeshBroken(broken_.empty() ? "could not send step plan to worker rank " + std::to_string(r) : broken_);
    }
  }

  const int64_t id = plan->step_id();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [&] {
    if (!broken_.empty()) return true;
    for (const auto& s : sessions)
      if (!s->results.count(id)) return false;
    return true;
  };
  // This thread reads the step channels itself (no hand-off from another thread); results that come on
  // a session stream, and lost ranks, reach it through wake_fd_.
  while (!done()) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      throw MeshBroken("step " + std::to_string(id) + " got no result within " +
                       std::to_string(timeout.count() / 1000) + " s");
    lock.unlock();
    WaitForResults(sessions, left);
    lock.lock();
  }
  if (!broken_.empty()) throw MeshBroken(broken_);
  const int64_t received_ns = NowNs();
  std::vector<StepResult> out;
  for (int r = 0; r < world_; ++r) {
    out.push_back(std::move(sessions[r]->results[id]));
    sessions[r]->results.clear();
    if (!out.back().error().empty()) {
      broken_ = "step failed on " + out.back().error();
      throw MeshBroken(broken_);
    }
    WorkerStats& st = stats_[r];
    st.set_step_count(st.step_count() + 1);
    st.set_step_time_seconds_sum(st.step_time_seconds_sum() + out.back().forward_seconds() + out.back().sample_seconds());
    st.set_forward_time_seconds_sum(st.forward_time_seconds_sum() + out.back().forward_seconds());
    st.set_collective_time_seconds_sum(st.collective_time_seconds_sum() + out.back().collective_seconds());
  }
  if (timing) {
    const StepResult& r0 = out[0];
    timing->wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    timing->plan_send = (r0.plan_received_unix_ns() - plan->sent_unix_ns()) * 1e-9;
    timing->forward = r0.forward_seconds() - r0.collective_seconds();
    timing->collectives = r0.collective_seconds();
    timing->collective_calls = r0.collective_calls();
    timing->sample = r0.sample_seconds();
    timing->result_return = (received_ns - r0.result_sent_unix_ns()) * 1e-9;
  }
  return out;
}

void WorkerMesh::ResetAll(const std::string& reason) {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : ranks_)
      if (s) sessions.push_back(s);
  }
  CoordinatorMessage m;
  m.mutable_reset()->set_reason(reason);
  for (auto& s : sessions) Write(s, m);
}

void WorkerMesh::DrainAll() {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : ranks_)
      if (s) sessions.push_back(s);
  }
  CoordinatorMessage m;
  m.mutable_drain();
  for (auto& s : sessions) Write(s, m);
}

std::string WorkerMesh::WaitBroken(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !broken_.empty(); });
  return broken_;
}

std::string WorkerMesh::broken_reason() {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

std::map<int, WorkerStats> WorkerMesh::worker_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace dsmesh

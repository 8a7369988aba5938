#include "coordinator/engine.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "common/sampling_params.h"

namespace dsmesh {
namespace {
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Engine::Engine(const EngineConfig& config, WorkerMesh* mesh)
    : config_(config), mesh_(mesh), next_seed_(std::random_device{}()) {}

struct Engine::WaitingOnWorkers {
  explicit WaitingOnWorkers(Engine* e) : e_(e) { e_->waiting_on_workers_ = true; }
  ~WaitingOnWorkers() {
    e_->waiting_on_workers_ = false;
    e_->Touch();
  }
  Engine* e_;
};

void Engine::Announce(bool ready, const std::string& status) {
  if (!config_.on_state) return;
  const std::string key = (ready ? "1" : "0") + status;
  {
    std::lock_guard<std::mutex> lock(announce_mu_);
    if (key == announced_) return;
    announced_ = key;
  }
  config_.on_state(ready, status);
}

std::string Engine::Health(std::chrono::steady_clock::duration max_stall) {
  const auto now = std::chrono::steady_clock::now();
  const auto stalled = now - std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(progress_.load()));
  if (stalled <= max_stall) return "";
  if (waiting_on_workers_ && now - mesh_->monitor_tick() <= max_stall) return "";
  const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(stalled).count();
  return waiting_on_workers_ ? "the worker heartbeat monitor stopped (engine blocked on the workers for " +
                                   std::to_string(ms) + " ms)"
                             : "the engine loop made no progress for " + std::to_string(ms) + " ms";
}

bool Engine::ready() {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_;
}

void Engine::Wake() { cv_.notify_all(); }

void Engine::BeginDrain() {
  draining_ = true;
  cv_.notify_all();
}

std::shared_ptr<Request> Engine::Submit(const GenerateRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) throw Unavailable("the coordinator is draining (shutting down); not admitting new requests");
  if (!ready_ || !scheduler_) throw Unavailable("the mesh is not ready: " + not_ready_reason_);
  scheduler_->Validate(req);
  ValidateSamplingParams(req.sampling(), scheduler_->config().vocab_size);
  const int max_queued = req.has_max_queued() ? std::min(config_.max_queued, std::max(0, req.max_queued()))
                                              : config_.max_queued;
  const size_t in_flight = scheduler_->num_running() + scheduler_->num_waiting() + incoming_.size();
  const size_t limit = static_cast<size_t>(config_.scheduler.max_num_seqs) + max_queued;
  if (in_flight >= limit) {
    ++rejected_;
    throw QueueFull("the server is overloaded: " + std::to_string(in_flight) +
                    " requests running or waiting in the coordinator, limit " +
                    std::to_string(config_.scheduler.max_num_seqs) + " running + " + std::to_string(max_queued) +
                    " queued (--max-queued); retry later");
  }
  auto r = std::make_shared<Request>();
  r->request_id = req.request_id();
  r->tokens.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
  r->prompt_len = req.prompt_token_ids_size();
  r->params = req.sampling();
  r->max_tokens = req.sampling().max_tokens() > 0 ? req.sampling().max_tokens()
                                                  : static_cast<int32_t>(scheduler_->max_seq_tokens() - r->prompt_len);
  r->priority = req.priority();
  r->seed = req.sampling().has_seed() ? req.sampling().seed() : next_seed_++;
  r->return_logits = req.return_logits();
  r->images.assign(req.images().begin(), req.images().end());
  incoming_.push_back(r);
  cv_.notify_all();
  return r;
}

void Engine::Cancel(const std::shared_ptr<Request>& r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r->cancelled.exchange(true)) return;
    pending_cancels_.push_back({r, planned_steps_});
  }
  cv_.notify_all();
}

void Engine::CountCancelledFrees() {
  for (size_t i = 0; i < pending_cancels_.size();) {
    const PendingCancel& p = pending_cancels_[i];
    if (p.r->phase != Request::Phase::kFinished) {
      ++i;
      continue;
    }
    ++cancelled_freed_;
    cancel_free_steps_max_ = std::max(cancel_free_steps_max_, planned_steps_ - p.planned_at_cancel);
    pending_cancels_[i] = std::move(pending_cancels_.back());
    pending_cancels_.pop_back();
  }
}

bool Engine::FormMesh(bool first) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = false;
  }
  const auto deadline = std::chrono::steady_clock::now() + config_.register_timeout;
  // A failed formation attempt: say why, reset the workers and try again shortly.
  auto retry_after = [&](const char* why) {
    std::fprintf(stderr, "[coordinator] mesh formation failed: %s; retrying\n", why);
    Announce(false, std::string("mesh formation failed: ") + why + "; retrying");
    {
      std::lock_guard<std::mutex> lock(mu_);
      not_ready_reason_ = lost_reason_.empty() ? why : lost_reason_ + "; mesh re-forming: " + why;
    }
    mesh_->ResetAll(why);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  };
  while (!draining_) {
    Touch();
    if (!mesh_->WaitAllRegistered(std::chrono::milliseconds(200))) {
      auto missing = mesh_->MissingRanks();
      std::string list;
      for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
      {
        std::lock_guard<std::mutex> lock(mu_);
        // After a loss /health says which worker went and that the mesh is re-forming.
        not_ready_reason_ = (lost_reason_.empty() ? "" : lost_reason_ + "; mesh re-forming: ") +
                            "waiting for worker rank(s) " + list + " to register";
      }
      Announce(false, "waiting for worker rank(s) " + list + " to register (world " + std::to_string(mesh_->world()) + ")");
      if (first && std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "[coordinator] error: worker rank(s) %s did not register within %lld s\n", list.c_str(),
                     (long long)(config_.register_timeout.count() / 1000));
        Announce(false, "error: worker rank(s) " + list + " did not register in time; exiting");
        return false;
      }
      continue;
    }
    try {
      Announce(false, "forming the mesh: all " + std::to_string(mesh_->world()) +
                          " rank(s) registered; waiting for them to load their shards and connect");
      std::vector<WorkerReady> readies;
      {
        WaitingOnWorkers waiting(this);
        readies = mesh_->Form(config_.ready_timeout);
      }
      std::vector<RankKvCapacity> caps;
      for (const auto& r : readies)
        caps.push_back({r.kv_budget_bytes(), r.state_bytes_per_token(), r.state_fixed_bytes(), r.kv_pool_blocks(),
                        r.kv_block_tokens(), r.kv_state_slots(), r.kv_block_bytes()});
      KvGeometry g = PlanKvGeometry(caps, config_.block_size);
      std::string status;
      {
        std::lock_guard<std::mutex> lock(mu_);
        SchedulerConfig sc = config_.scheduler;
        if (readies[0].vocab_size() != sc.vocab_size)
          throw MeshBroken("workers report vocab " + std::to_string(readies[0].vocab_size()) + " but config.json says " +
                           std::to_string(sc.vocab_size));
        if (scheduler_) {
          scheduler_->Reconfigure(g);
        } else {
          scheduler_.emplace(sc, g);
        }
        ready_ = true;
        not_ready_reason_.clear();
        lost_reason_.clear();
        std::fprintf(stderr, "[coordinator] mesh epoch %lld ready: %d ranks; %s\n", (long long)mesh_->epoch(),
                     mesh_->world(), g.Describe(sc.max_num_seqs).c_str());
        status = "serving: mesh epoch " + std::to_string(mesh_->epoch()) + ", " + std::to_string(mesh_->world()) +
                 " rank(s); " + g.Describe(sc.max_num_seqs);
      }
      Announce(true, status);
      return true;
    } catch (const FormationError& e) {
      // At start-up a worker that cannot load or shard the model will not do better on a retry: give up
      // with its message. Later (a worker came back) keep retrying; the supervisor may be fixing it.
      if (first) {
        std::fprintf(stderr, "[coordinator] error: %s\n", e.what());
        Announce(false, std::string("error: ") + e.what() + "; exiting");
        mesh_->ResetAll(e.what());
        return false;
      }
      retry_after(e.what());
    } catch (const std::exception& e) {
      retry_after(e.what());
    }
  }
  return !first;
}

void Engine::Fail(const std::string& reason) {
  const std::string error = "mesh failure: " + reason + "; the request was aborted";
  std::fprintf(stderr, "[coordinator] %s\n", error.c_str());
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = false;
    lost_reason_ = "mesh lost: " + reason;
    not_ready_reason_ = lost_reason_ + "; mesh re-forming";
    for (auto& r : incoming_) scheduler_->Add(r);
    incoming_.clear();
    scheduler_->FailAll(error);
  }
  Announce(false, "not ready: mesh lost (" + reason + "); waiting for the workers to rejoin");
  mesh_->ResetAll(reason);
}

void Engine::Step() {
  auto t0 = std::chrono::steady_clock::now();
  StepPlan plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : incoming_) scheduler_->Add(r);
    incoming_.clear();
    plan = scheduler_->Schedule();
    CountCancelledFrees();
    if (plan.seqs_size() > 0) ++planned_steps_;
  }
  double sched = Since(t0);
  if (plan.seqs_size() == 0 && plan.free_seqs_size() == 0 && plan.drop_snapshots_size() == 0) return;
  StepTiming timing;
  std::vector<StepResult> results;
  {
    WaitingOnWorkers waiting(this);
    results = mesh_->RunStep(&plan, config_.step_timeout, &timing);  // throws MeshBroken
  }
  auto t1 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  scheduler_->ObserveStepCost(plan, results[0], timing.wall);
  scheduler_->Apply(plan, results[0]);
  sched += Since(t1);
  if (plan.seqs_size() > 0) {
    ++steps_;
    timing_sum_.wall += timing.wall;
    timing_sum_.plan_send += timing.plan_send;
    timing_sum_.forward += timing.forward;
    timing_sum_.collectives += timing.collectives;
    timing_sum_.collective_calls += timing.collective_calls;
    timing_sum_.sample += timing.sample;
    timing_sum_.result_return += timing.result_return;
    schedule_seconds_ += sched;
  }
}

int Engine::Run() {
  if (!FormMesh(true)) return 1;
  auto drain_start = std::chrono::steady_clock::time_point::max();
  while (true) {
    Touch();
    if (draining_) {
      if (drain_start == std::chrono::steady_clock::time_point::max()) {
        drain_start = std::chrono::steady_clock::now();
        std::fprintf(stderr, "[coordinator] draining: finishing running requests (up to %lld s)\n",
                     (long long)(config_.drain_timeout.count() / 1000));
        Announce(false, "draining: not admitting; finishing running requests");
      }
      bool idle;
      {
        std::lock_guard<std::mutex> lock(mu_);
        idle = !scheduler_ || (!scheduler_->HasWork() && incoming_.empty());
        if (!idle && std::chrono::steady_clock::now() - drain_start > config_.drain_timeout) {
          for (auto& r : incoming_) scheduler_->Add(r);
          incoming_.clear();
          scheduler_->FailAll("the coordinator shut down before the request finished (drain timeout)");
          idle = true;
        }
      }
      if (idle || !ready()) break;
    }
    if (!ready()) {
      if (!FormMesh(false)) break;
      continue;
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50),
                   [&] { return draining_ || !incoming_.empty() || scheduler_->HasWork(); });
    }
    std::string broken = mesh_->broken_reason();
    if (!broken.empty()) {
      Fail(broken);
      continue;
    }
    try {
      Step();
    } catch (const MeshBroken& e) {
      Fail(e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (scheduler_) {
      for (auto& r : incoming_) scheduler_->Add(r);
      incoming_.clear();
      if (scheduler_->HasWork()) scheduler_->FailAll("the coordinator shut down");
    }
  }
  mesh_->DrainAll();
  std::fprintf(stderr, "[coordinator] drained; exiting\n");
  return 0;
}

StatsResponse Engine::Stats() {
  StatsResponse s;
  std::lock_guard<std::mutex> lock(mu_);
  s.set_ready(ready_);
  s.set_draining(draining_);
  s.set_not_ready_reason(ready_ ? "" : not_ready_reason_);
  s.set_world(mesh_->world());
  s.set_mesh_epoch(mesh_->epoch());
  s.set_worker_restarts(mesh_->worker_restarts());
  s.set_max_num_seqs(config_.scheduler.max_num_seqs);
  s.set_max_model_len(config_.scheduler.max_model_len);
  s.set_scheduling_policy(SchedulingPolicyName(config_.scheduler.policy));
  s.set_long_prefill_token_threshold(config_.scheduler.long_prefill_token_threshold);
  s.set_max_decode_slowdown(config_.scheduler.max_decode_slowdown);
  s.set_max_queued(config_.max_queued);
  s.set_num_requests_rejected(rejected_);
  s.set_num_cancelled_requests(cancelled_freed_);
  s.set_cancel_free_steps_max(cancel_free_steps_max_);
  if (scheduler_) {
    s.set_num_requests_running(static_cast<int32_t>(scheduler_->num_running()));
    s.set_num_requests_waiting(static_cast<int32_t>(scheduler_->num_waiting() + incoming_.size()));
    s.set_kv_cache_usage_perc(scheduler_->kv_usage());
    s.set_kv_cache_tokens(scheduler_->geometry().pool_tokens());
    s.set_kv_cache_blocks(scheduler_->geometry().num_blocks);
    s.set_kv_block_size(scheduler_->geometry().block_size);
    s.set_prefix_cache_queries(scheduler_->prefix_cache().queries);
    s.set_prefix_cache_hits(scheduler_->prefix_cache().hits);
    s.set_num_preemptions(scheduler_->num_preemptions());
    s.set_mixed_step_prefill_caps(scheduler_->mixed_step_caps());
    s.set_max_seq_tokens(scheduler_->max_seq_tokens());
    const SpecDecodeStats& spec = scheduler_->spec_stats();
    s.set_spec_decode_num_drafts(spec.num_drafts);
    s.set_spec_decode_num_draft_tokens(spec.num_draft_tokens);
    s.set_spec_decode_num_accepted_tokens(spec.num_accepted_tokens);
    for (int64_t n : spec.accepted_per_pos) s.add_spec_decode_num_accepted_tokens_per_pos(n);
    s.set_spec_decode_draft_passes(spec.draft_passes);
    s.set_spec_decode_draft_seconds_sum(spec.draft_seconds);
    if (config_.scheduler.num_speculative_tokens > 0)
      for (int d = 0; d < kNumDraftDecisions; ++d)
        (*s.mutable_spec_decode_draft_decisions())[DraftDecisionName(static_cast<DraftDecision>(d))] = spec.decisions[d];
  }
  s.set_steps(steps_);
  s.set_step_wall_seconds_sum(timing_sum_.wall);
  s.set_plan_send_seconds_sum(timing_sum_.plan_send);
  s.set_forward_seconds_sum(timing_sum_.forward);
  s.set_collective_seconds_sum(timing_sum_.collectives);
  s.set_sample_seconds_sum(timing_sum_.sample);
  s.set_result_return_seconds_sum(timing_sum_.result_return);
  s.set_schedule_seconds_sum(schedule_seconds_);
  s.set_collective_calls(timing_sum_.collective_calls);
  for (auto& [rank, ws] : mesh_->worker_stats()) *s.add_workers() = ws;
  return s;
}

}  // namespace dsmesh

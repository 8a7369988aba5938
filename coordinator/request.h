// A generation request as the coordinator tracks it, and the queue its responses flow through to the
// Generate stream that asked for it.
//
// States: waiting -> running (prefill chunks, then one decode token per step) -> finished
//         (stop / length / abort). A running request the KV pool cannot grow is preempted: its worker
//         state is dropped and it waits again in its rank (priority, then arrival), to be recomputed from
//         its tokens (prompt + output so far) when blocks free up. Nothing is dropped silently.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/draft_policy.h"
#include "proto/mesh.pb.h"

namespace dsmesh {

class ResponseQueue {
 public:
  void Push(GenerateResponse r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      items_.push_back(std::move(r));
    }
    cv_.notify_one();
  }
  // Waits up to `timeout` for the next response.
  bool Pop(GenerateResponse* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return false;
    *out = std::move(items_.front());
    items_.pop_front();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerateResponse> items_;
};

struct Request {
  std::string request_id;
  std::vector<int32_t> tokens;  // prompt followed by the generated tokens
  int32_t prompt_len = 0;
  int32_t max_tokens = 0;       // effective (resolved against max_model_len)
  SamplingParams params;
  uint64_t seed = 0;            // effective seed
  bool return_logits = false;
  // Images (blocks already in `tokens`; PromptImage.begin ascending). A block is prefilled in one step; the
  // prefix cache tells pictures apart by image_ids (Scheduler::CacheKey), filled at the first admission.
  std::vector<PromptImage> images;
  std::vector<int32_t> image_ids;
  int32_t priority = 0;         // lower runs first (scheduling policy "priority"); 0 under fcfs
  std::shared_ptr<ResponseQueue> out = std::make_shared<ResponseQueue>();
  std::atomic<bool> cancelled{false};  // set by the Generate handler when the client goes away
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();

  // Scheduler state (engine thread only).
  enum class Phase { kWaiting, kRunning, kFinished } phase = Phase::kWaiting;
  uint64_t arrival_seq = 0;     // order of arrival at the scheduler (ties of priority; fcfs)
  int64_t arrival_step = 0;     // scheduler steps run before the request arrived
  uint64_t seq_id = 0;          // worker-side sequence id of the current admission
  int64_t computed = 0;         // tokens the worker state has consumed
  bool first_chunk = true;
  uint64_t restore_snapshot = 0;
  int64_t snapshot_at = 0;      // block boundary at which to snapshot (0 = none)
  int64_t cached_tokens = 0;
  bool reported_first = false;
  std::vector<int32_t> drafts;  // MTP drafts for the next step (rank 0's last result)
  std::optional<SequenceDraftPolicy> draft_policy;  // with speculation, from the first decode step on
  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
};

}  // namespace dsmesh

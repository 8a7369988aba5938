// Continuous batching. Each step:
//   1. running requests in admission order (FCFS): decode ones feed their newest token, prefilling ones
//      their next chunk, under the max-batched-tokens budget; a request whose blocks cannot grow first
//      evicts prefix-cache snapshots, then preempts the newest running request (recompute later);
//   2. waiting requests are admitted in arrival order while a slot (max-num-seqs), budget and blocks
//      remain; the head of the queue blocks the rest (strict FCFS).
// Prefill chunks are cut at the request's snapshot boundary so the prefix cache can copy the state there.
// With speculation a decoding sequence feeds its newest token plus the drafts rank 0 returned last step
// (blocks reserved for all of them first); Apply appends the accepted tokens one at a time, so stop
// conditions end the sequence at the first token that meets one and drop the rest.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/kv_blocks.h"
#include "coordinator/prefix_cache.h"
#include "coordinator/request.h"
#include "proto/mesh.pb.h"

namespace dsmesh {

struct SchedulerConfig {
  int max_num_seqs = 4;
  int max_batched_tokens = 512;
  int max_model_len = 4096;
  bool prefix_caching = true;
  int64_t vocab_size = 0;
  int32_t eos_token_id = -1;
  int num_speculative_tokens = 0;  // MTP drafts per decoding sequence and step (0: no speculation)
};

// Speculative decoding counters (vLLM's vllm:spec_decode_* meanings).
struct SpecDecodeStats {
  int64_t num_drafts = 0;          // verification steps that carried drafts (per sequence)
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  // [i]: drafts accepted at position i
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const KvGeometry& geometry);

  // Checks the request against the limits; throws std::invalid_argument with a client-facing message.
  void Validate(const GenerateRequest& req) const;
  void Add(std::shared_ptr<Request> r);

  bool HasWork() const;
  // The next step's plan (may carry only frees/drops). Requests cancelled since the last step are
  // finished here and their sequences freed in this plan.
  StepPlan Schedule();
  // Applies rank 0's result for `plan`: appends tokens, streams responses, finishes requests.
  void Apply(const StepPlan& plan, const StepResult& result);
  // Fails every request (running and waiting) with `error`, and forgets all worker-side state.
  void FailAll(const std::string& error);
  // Starts over on a (re)formed mesh; requires no requests.
  void Reconfigure(const KvGeometry& geometry);

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  const KvGeometry& geometry() const { return blocks_.geometry(); }
  // Fraction of blocks held by live sequences. Prefix-cache snapshots are evictable on demand, so (as
  // vLLM counts cached free blocks) they do not count as used.
  double kv_usage() const;
  const PrefixCache& prefix_cache() const { return cache_; }
  const SchedulerConfig& config() const { return config_; }
  int64_t num_preemptions() const { return preemptions_; }
  const SpecDecodeStats& spec_stats() const { return spec_; }

 private:
  bool Reserve(uint64_t owner, int64_t tokens, const std::set<uint64_t>& pinned);
  void Preempt(std::shared_ptr<Request> r);
  void Finish(const std::shared_ptr<Request>& r, FinishReason reason, const std::string& error,
              GenerateResponse* response);
  SequencePlan* AddChunk(StepPlan* plan, Request& r, int64_t n);

  SchedulerConfig config_;
  KvBlocks blocks_;
  PrefixCache cache_;
  uint64_t next_id_ = 1;  // sequence and snapshot ids share one space
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<std::shared_ptr<Request>> running_;
  std::vector<uint64_t> pending_frees_, pending_drops_;
  struct PendingSnapshot {
    uint64_t id;
    std::vector<int32_t> tokens;
    int64_t len;
  };
  std::vector<PendingSnapshot> pending_snapshots_;
  int64_t preemptions_ = 0;
  SpecDecodeStats spec_;
};

}  // namespace dsmesh

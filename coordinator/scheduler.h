// Continuous batching with chunked prefill, priorities and recompute preemption.
//
// Rank: under the fcfs policy requests rank by arrival; under the priority policy by (priority, arrival),
// the lower priority value first. Rank orders admission, each part of the step's budget, and preemption.
//
// Each step shares the --max-num-batched-tokens budget. With long_prefill_token_threshold T > 0 (the fair order):
//   1. decodes (running requests whose next input is their newest token), in rank order;
//   2. first chunks of waiting requests, admitted in rank order while a slot (max-num-seqs), budget and
//      blocks remain; the best-ranked waiting request that cannot get blocks stops admission;
//   3. continuing prefills of running requests, in rank order.
//   Whenever another request runs or waits, a prefill chunk takes at most T tokens; a request alone takes
//   the whole budget.
// With T = 0 (vLLM's default scheduler): running requests take the budget first in rank order, a prefill
// as much as is left; waiting requests are admitted with the rest.
//
// Blocks: running requests grow before anything is admitted. One whose blocks cannot grow first evicts
// prefix-cache snapshots, then preempts the worst-ranked running request (itself included): its blocks
// are freed and it waits again in its rank, to be recomputed from prompt + generated tokens (with prefix
// caching mostly a cache hit). A step that preempted admits nothing. Prefill chunks are cut at the
// request's snapshot boundary so the prefix cache can copy the state there.
//
// With speculation a decoding sequence feeds its newest token plus the drafts rank 0 returned last step
// (blocks reserved for all of them first; the drafts count against the budget with the decode rows);
// Apply appends the accepted tokens one at a time, so stop conditions end the sequence at the first
// token that meets one and drop the rest. Each decoding sequence's draft policy (draft_policy.h) decides
// in every plan how many drafts the worker proposes after the step (SequencePlan.drafts_withheld).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/draft_policy.h"
#include "coordinator/kv_blocks.h"
#include "coordinator/mixed_step_budget.h"
#include "coordinator/prefix_cache.h"
#include "coordinator/request.h"
#include "coordinator/simulated_acceptance.h"
#include "proto/mesh.pb.h"

namespace dsmesh {

enum class SchedulingPolicy { kFcfs, kPriority };

// "fcfs" or "priority"; throws std::invalid_argument naming the accepted values.
SchedulingPolicy ParseSchedulingPolicy(const std::string& name);
const char* SchedulingPolicyName(SchedulingPolicy policy);

// Logits rows a return_logits request may get back from one step (8 MiB: 16 rows at vocab 129,280).
constexpr int64_t kMaxLogitsBytesPerStep = 8ll << 20;

// The default long_prefill_token_threshold: a quarter of the default budget.
constexpr int kDefaultLongPrefillTokenThreshold = 128;

struct SchedulerConfig {
  int max_num_seqs = 4;
  int max_batched_tokens = 512;
  int max_model_len = 4096;
  bool prefix_caching = true;
  int64_t vocab_size = 0;
  int32_t eos_token_id = -1;
  int long_prefill_token_threshold = kDefaultLongPrefillTokenThreshold;  // 0: vLLM's default order
  // With the fair order: a step that prefills beside decoding sequences takes at most this many times a
  // decode-only step, as measured (coordinator/mixed_step_budget.h; --max-decode-slowdown). <= 1: off.
  double max_decode_slowdown = 0;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  int num_speculative_tokens = 0;  // MTP drafts per decoding sequence and step (0: no speculation)
  // How many of them each sequence proposes (coordinator/draft_policy.h); max_drafts comes from
  // num_speculative_tokens.
  DraftPolicyConfig draft_policy;
  // Bench only (coordinator/simulated_acceptance.h): per-position acceptance rates that decide the drafts
  // (empty: verification decides, as in serving) and the generator's seed.
  std::vector<double> simulated_acceptance;
  uint64_t simulated_acceptance_seed = 1;
};

// Speculative decoding counters (vLLM's vllm:spec_decode_* meanings).
struct SpecDecodeStats {
  int64_t num_drafts = 0;          // verification steps that carried drafts (per sequence)
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  // [i]: drafts accepted at position i
  std::array<int64_t, kNumDraftDecisions> decisions{};  // the draft policy's, by DraftDecision
  // MTP draft passes run (per step: the most drafts a sequence asked for; Model::Draft batches the
  // sequences) and rank 0's time in them (StepResult.draft_seconds, the MTP window catch-up included).
  int64_t draft_passes = 0;
  double draft_seconds = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const KvGeometry& geometry);

  // Checks the request against the limits (context length, what the KV pool can hold for one sequence,
  // priority under fcfs); throws std::invalid_argument with a client-facing message.
  void Validate(const GenerateRequest& req) const;
  void Add(std::shared_ptr<Request> r);
  // Tokens (prompt + completion) one sequence can reach: max_model_len or the pool, whichever is smaller.
  int64_t max_seq_tokens() const;

  bool HasWork() const;
  // The next step's plan (may carry only frees/drops). Requests cancelled since the last step are
  // finished here and their sequences freed in this plan.
  StepPlan Schedule();
  // Applies rank 0's result for `plan`: appends tokens, streams responses, finishes requests.
  void Apply(const StepPlan& plan, const StepResult& result);
  // The step's measured time (plan written -> every result back): for the mixed-step budget
  // (max_decode_slowdown) and, with speculation, the draft policy's cost model (decode-only steps).
  void ObserveStepCost(const StepPlan& plan, const StepResult& result, double wall_seconds);
  const MixedStepBudget& mixed_step_budget() const { return mixed_; }
  // Steps whose prefill tokens the mixed-step budget cut.
  int64_t mixed_step_caps() const { return mixed_caps_; }
  const StepCostModel& step_costs() const { return costs_; }
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
  int64_t steps() const { return steps_; }  // plans that ran sequences
  const SpecDecodeStats& spec_stats() const { return spec_; }

 private:
  bool Reserve(uint64_t owner, int64_t tokens, const std::set<uint64_t>& pinned);
  // Evicts least-recently-used snapshots (never `pinned` ones) until fits() holds; false when none is left.
  bool EvictUntil(const std::function<bool()>& fits, const std::set<uint64_t>& pinned);
  bool RanksBefore(const Request& a, const Request& b) const;
  void Enqueue(std::shared_ptr<Request> r);     // into waiting_, by rank
  void AddRunning(std::shared_ptr<Request> r);  // into running_, by rank
  void Preempt(std::shared_ptr<Request> r);
  void FinishCancelled();
  void Finish(const std::shared_ptr<Request>& r, FinishReason reason, const std::string& error,
              GenerateResponse* response);
  SequencePlan* AddChunk(StepPlan* plan, Request& r, int64_t n, const std::set<uint64_t>& pinned);
  // The prefix cache's key of r: its tokens, with the first row of each image block replaced by the
  // picture's interned id (negative, so never a token): two prompts share a cached prefix only when their
  // pictures are byte for byte the same (grid, row order and patches), not merely the same size.
  std::vector<int32_t> CacheKey(Request& r);
  int32_t InternImage(const PromptImage& im);
  // Whether position p lies strictly inside an image block of r (a snapshot or a restored prefix may
  // start or end at a block's first row, never inside it: a block is prefilled in one step).
  static bool InsideImage(const Request& r, int64_t p);

  SchedulerConfig config_;
  KvBlocks blocks_;
  PrefixCache cache_;
  uint64_t next_id_ = 1;  // sequence and snapshot ids share one space
  uint64_t next_arrival_ = 1;
  std::deque<std::shared_ptr<Request>> waiting_;   // best rank first
  std::vector<std::shared_ptr<Request>> running_;  // best rank first
  std::vector<uint64_t> pending_frees_, pending_drops_;
  struct PendingSnapshot {
    uint64_t id;
    std::vector<int32_t> tokens;
    int64_t len;
  };
  std::vector<PendingSnapshot> pending_snapshots_;
  // Picture contents -> (id, last use), at most kInternedImages (least recently used go; their ids are
  // never reused, so cache entries keyed by them just stop matching).
  static constexpr size_t kInternedImages = 64;
  std::map<std::string, std::pair<int32_t, uint64_t>> interned_images_;
  int32_t next_image_id_ = 0;
  uint64_t image_clock_ = 0;
  int64_t preemptions_ = 0;
  int64_t steps_ = 0;
  SpecDecodeStats spec_;
  StepCostModel costs_;
  MixedStepBudget mixed_;
  int64_t mixed_caps_ = 0;
  bool logged_mixed_cap_ = false;
  std::optional<AcceptanceSimulator> simulated_;
};

}  // namespace dsmesh

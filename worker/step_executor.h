// Executes step plans on one rank: keeps every sequence's model state and the prefix-cache snapshots,
// runs the batched forward, and on rank 0 samples the next tokens. With speculative decoding every rank
// also verifies the plan's drafts on the gathered logits (greedy: accepted while equal to the argmax;
// sampled: rejection sampling, rejection_sampler.h; identical on every rank), rolls the state back to the
// accepted position and drafts the next tokens with the MTP block (greedy requests: argmax drafts; sampled
// requests: drawn from the MTP head's processed distribution). All ranks run identical plans in identical
// order (the collectives inside Forward pair up across ranks).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "model/model.h"
#include "proto/mesh.pb.h"
#include "worker/mesh_communicator.h"
#include "common/structured/token_grammar.h"
#include "worker/sampler.h"

namespace dsmesh {

class StepExecutor {
 public:
  StepExecutor(Model* model, MeshCommunicator* comm) : model_(model), comm_(comm) {}

  // Throws std::runtime_error on any inconsistency (unknown sequence, position mismatch) or model error.
  StepResult Run(const StepPlan& plan);
  // Forgets every sequence and snapshot (the mesh broke; the coordinator starts over).
  void Reset();

  // Test hook: may replace the MTP drafts of a sequence before they are returned (forced acceptances and
  // rejections). Runs on every rank; it must change them identically everywhere. A sampled request verifies
  // a replaced draft as a greedy one (one-hot q).
  // `position` is where the first draft would sit.
  void set_draft_hook(std::function<void(uint64_t seq_id, int64_t position, std::vector<int32_t>* drafts)> hook) {
    draft_hook_ = std::move(hook);
  }

  // Whether plans may carry simulated draft acceptance (SequencePlan.simulated_acceptance): only a worker
  // that `dsmesh bench --draft-acceptance` started (dsmesh-worker --bench-simulated-acceptance); any other
  // refuses such a plan, so serving never emits tokens the bench's generator chose.
  void set_simulated_acceptance_allowed(bool on) { simulated_acceptance_allowed_ = on; }

  // Where the tokenizer for constrained decoding is loaded from (the model directory), on first use.
  void set_tokenizer_dir(std::string dir) { tokenizer_dir_ = std::move(dir); }
  void set_tokenizer(std::shared_ptr<const Tokenizer> tokenizer) { tokenizer_ = std::move(tokenizer); }

  // Rows sampled on the backend (Backend::SampleRows: only tokens and logprobs leave the device) rather
  // than from logits copied to the host. A step goes to the device when every row of it can: no
  // penalties, no grammar mask, no raw logits asked for, no sampled drafts to verify (greedy drafts are
  // verified by the device's argmax), one rank. Each path logs once, the host path with its reason.
  void set_device_sampling(bool on) { device_sampling_ = on; }
  struct SamplingCounts {
    int64_t device_rows = 0;
    int64_t host_rows = 0;
  };
  SamplingCounts sampling_counts() const { return sampling_counts_; }

  size_t num_sequences() const { return seqs_.size(); }
  size_t num_snapshots() const { return snapshots_.size(); }
  size_t StateBytes() const;

 private:
  struct Sequence {
    std::unique_ptr<SequenceState> state;
    int32_t prompt_len = 0;
    SamplingParams params;
    uint64_t seed = 0;
    int speculative_tokens = 0;  // drafts per step (0: no speculation)
    PenaltyState penalties;      // every rank: speculative acceptance runs on every rank
    // Sampled requests: the drafts this executor drew last step and the distributions q they were drawn from.
    std::vector<int32_t> drawn_drafts;
    std::vector<TokenDist> draft_dists;
    // Constrained decoding: the grammar and its state after every fed token (-1: left the grammar).
    std::shared_ptr<structured::CompiledGrammar> grammar;
    int32_t grammar_state = 0;
  };

  structured::GrammarCache& Grammars();
  // Copies `row` into masked_ with every token the grammar forbids at `state` set to -inf.
  const float* MaskRow(Sequence& s, int32_t state, int64_t generated, const float* row, int64_t vocab);
  // Why this sequence's rows must be sampled on the host this step, or nullptr when the device can.
  static const char* HostSamplingReason(const SequencePlan& sp, const Sequence& s);
  // Counts rows of one sequence by path; logs the first use of each path (and each host reason).
  void CountSampledRows(bool on_device, int64_t rows, const char* host_reason);
  static void Advance(Sequence& s, int32_t token) {
    if (s.grammar && s.grammar_state >= 0) s.grammar_state = s.grammar->AdvanceToken(s.grammar_state, token);
  }

  Model* model_;
  MeshCommunicator* comm_;
  std::unordered_map<uint64_t, Sequence> seqs_;
  std::unordered_map<uint64_t, std::unique_ptr<SequenceState>> snapshots_;
  std::function<void(uint64_t, int64_t, std::vector<int32_t>*)> draft_hook_;
  std::string tokenizer_dir_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<structured::GrammarCache> grammars_;
  std::vector<float> masked_;
  bool device_sampling_ = true;
  bool simulated_acceptance_allowed_ = false;
  SamplingCounts sampling_counts_;
  std::set<std::string> logged_sampling_paths_;
  std::vector<uint64_t> mask_scratch_;
};

}  // namespace dsmesh

// Batch preparation for the step executor: the sequences and prefix-cache snapshots one rank keeps, and
// the batch a step plan makes of them. It checks the plan against what it holds (unknown or existing
// sequences, positions, draft counts, simulated acceptance), creates new sequences (fresh state or a
// snapshot's clone, penalties and grammar state of the tokens restored from the cache), and takes the
// snapshots a plan asks for after the forward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/structured/token_grammar.h"
#include "model/model.h"
#include "proto/mesh.pb.h"
#include "worker/step_sequence.h"

namespace dsmesh {

class SequenceTable {
 public:
  // The grammar cache, built on first use (it needs the tokenizer).
  using GrammarSource = std::function<structured::GrammarCache&()>;

  SequenceTable(Model* model, GrammarSource grammars) : model_(model), grammars_(std::move(grammars)) {}

  // Whether plans may carry simulated draft acceptance (StepExecutor::set_simulated_acceptance_allowed).
  void set_simulated_acceptance_allowed(bool on) { simulated_acceptance_allowed_ = on; }

  // Drops the sequences and snapshots the plan frees.
  void ApplyFrees(const StepPlan& plan);
  // One SequenceStep per planned sequence, in plan order (tokens then drafts; all logits when the plan
  // asks for raw logits or verifies drafts; the chunk's image rows). Sampling is left unset.
  // Throws std::runtime_error ("plan: ...") on any inconsistency with what this table holds.
  std::vector<SequenceStep> PrepareBatch(const StepPlan& plan);
  // After the forward: the snapshot `sp` asks for (snapshot_after), of the state as it is now.
  void TakeSnapshot(const SequencePlan& sp);

  StepSequence& at(uint64_t seq_id) { return seqs_.at(seq_id); }
  const StepSequence& at(uint64_t seq_id) const { return seqs_.at(seq_id); }
  void Clear();
  size_t num_sequences() const { return seqs_.size(); }
  size_t num_snapshots() const { return snapshots_.size(); }
  size_t StateBytes() const;

 private:
  // A sequence the plan starts (is_new): its state, parameters, grammar and restored tokens.
  StepSequence NewSequence(const SequencePlan& sp, bool external);
  // Throws when `sp` does not fit `s` (position, simulated acceptance, drafts).
  void CheckPlanned(const SequencePlan& sp, const StepSequence& s) const;

  Model* model_;
  GrammarSource grammars_;
  bool simulated_acceptance_allowed_ = false;
  std::unordered_map<uint64_t, StepSequence> seqs_;
  std::unordered_map<uint64_t, std::unique_ptr<SequenceState>> snapshots_;
};

}  // namespace dsmesh

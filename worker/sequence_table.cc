#include "worker/sequence_table.h"

#include <stdexcept>
#include <string>

#include "worker/plan_images.h"

namespace dsmesh {
namespace {

std::vector<int32_t> Table(const google::protobuf::RepeatedField<int32_t>& t) { return {t.begin(), t.end()}; }

}  // namespace

void SequenceTable::ApplyFrees(const StepPlan& plan) {
  for (uint64_t id : plan.free_seqs()) seqs_.erase(id);
  for (uint64_t id : plan.drop_snapshots()) snapshots_.erase(id);
}

void SequenceTable::Clear() {
  seqs_.clear();
  snapshots_.clear();
}

size_t SequenceTable::StateBytes() const {
  size_t total = 0;
  for (const auto& [id, s] : seqs_) total += s.state->MemoryBytes();
  for (const auto& [id, s] : snapshots_) total += s->MemoryBytes();
  return total;
}

StepSequence SequenceTable::NewSequence(const SequencePlan& sp, bool external) {
  if (seqs_.count(sp.seq_id())) throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " exists");
  StepSequence s;
  if (sp.restore_snapshot()) {
    auto it = snapshots_.find(sp.restore_snapshot());
    if (it == snapshots_.end())
      throw std::runtime_error("plan: unknown prefix-cache snapshot " + std::to_string(sp.restore_snapshot()));
    s.state = external ? it->second->CloneInto(sp.state_slot(), Table(sp.block_table())) : it->second->Clone();
    if (s.state->speculative_tokens() != sp.num_speculative_tokens())
      throw std::runtime_error("plan: snapshot " + std::to_string(sp.restore_snapshot()) + " keeps " +
                               std::to_string(s.state->speculative_tokens()) + " speculative rows, the sequence wants " +
                               std::to_string(sp.num_speculative_tokens()));
  } else {
    s.state = model_->NewState(sp.num_speculative_tokens(), external ? sp.state_slot() : -1);
  }
  // Drafting needs no logprobs per produced token (one result carries one token's) and no raw logits.
  const bool logprobs = sp.sampling().want_logprobs() || sp.sampling().logprobs() > 0;
  s.speculative_tokens = logprobs || sp.return_logits() ? 0 : sp.num_speculative_tokens();
  s.prompt_len = sp.prompt_len();
  s.params = sp.sampling();
  s.seed = sp.seed();
  if (!sp.sampling().structured_output().empty()) {
    try {
      s.grammar = grammars_().Get(sp.sampling().structured_output());
    } catch (const structured::GrammarError& e) {
      throw std::runtime_error(std::string("plan: sequence structured_output: ") + e.what());
    }
    s.grammar_state = s.grammar->start();
  }
  for (int i = 0; i < sp.prompt_tokens_size(); ++i) {
    if (i < sp.prompt_len()) {
      s.penalties.AddPromptToken(sp.prompt_tokens(i));
    } else if (i < sp.start_pos()) {
      s.penalties.AddOutputToken(sp.prompt_tokens(i));  // generated before a preemption, restored from cache
      AdvanceGrammar(s, sp.prompt_tokens(i));
    }
  }
  return s;
}

void SequenceTable::CheckPlanned(const SequencePlan& sp, const StepSequence& s) const {
  if (s.state->length() != sp.start_pos())
    throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " starts at " +
                             std::to_string(sp.start_pos()) + " but its state holds " +
                             std::to_string(s.state->length()) + " tokens");
  // Simulated acceptance is the bench's (`dsmesh bench --draft-acceptance`): only a worker started by the
  // bench (--bench-simulated-acceptance) takes it, so a serving mesh can never emit tokens it decided.
  if (sp.has_simulated_acceptance() && !simulated_acceptance_allowed_)
    throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) +
                             " carries simulated draft acceptance, a bench-only path (dsmesh bench "
                             "--draft-acceptance); this worker was not started for the bench");
  if (sp.has_simulated_acceptance() && sp.simulated_acceptance().accepted_drafts() < 0)
    throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " simulates a negative acceptance");
  if (sp.draft_tokens_size() > 0 &&
      (sp.tokens_size() != 1 || !sp.sample() || sp.draft_tokens_size() > s.speculative_tokens))
    throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " has " +
                             std::to_string(sp.draft_tokens_size()) + " drafts after " +
                             std::to_string(sp.tokens_size()) + " tokens (speculating " +
                             std::to_string(s.speculative_tokens) + ")");
}

std::vector<SequenceStep> SequenceTable::PrepareBatch(const StepPlan& plan) {
  // With the coordinator planning the state pool, every state lives in the slot and blocks it is sent.
  const bool external = model_->state_pool().external();
  std::vector<SequenceStep> batch;
  batch.reserve(plan.seqs_size());
  for (const auto& sp : plan.seqs()) {
    if (sp.tokens_size() == 0) throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " has no tokens");
    if (sp.is_new()) seqs_.emplace(sp.seq_id(), NewSequence(sp, external));
    auto it = seqs_.find(sp.seq_id());
    if (it == seqs_.end()) throw std::runtime_error("plan: unknown sequence " + std::to_string(sp.seq_id()));
    CheckPlanned(sp, it->second);
    if (external) it->second.state->SetBlockTable(Table(sp.block_table()));
    SequenceStep step;
    step.state = it->second.state.get();
    step.tokens.assign(sp.tokens().begin(), sp.tokens().end());
    step.tokens.insert(step.tokens.end(), sp.draft_tokens().begin(), sp.draft_tokens().end());
    step.all_logits = sp.return_logits() || sp.draft_tokens_size() > 0;
    step.images = ImageRowsForChunk(*model_, sp);
    batch.push_back(std::move(step));
  }
  return batch;
}

void SequenceTable::TakeSnapshot(const SequencePlan& sp) {
  if (!sp.snapshot_after()) return;
  const StepSequence& s = seqs_.at(sp.seq_id());
  snapshots_[sp.snapshot_after()] = model_->state_pool().external()
                                        ? s.state->CloneInto(sp.snapshot_slot(), Table(sp.snapshot_blocks()))
                                        : s.state->Clone();
}

}  // namespace dsmesh

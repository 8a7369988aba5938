#include "worker/step_executor.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace dsmesh {
namespace {
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void StepExecutor::Reset() {
  seqs_.clear();
  snapshots_.clear();
}

size_t StepExecutor::StateBytes() const {
  size_t total = 0;
  for (const auto& [id, s] : seqs_) total += s.state->MemoryBytes();
  for (const auto& [id, s] : snapshots_) total += s->MemoryBytes();
  return total;
}

StepResult StepExecutor::Run(const StepPlan& plan) {
  const bool rank0 = comm_->rank() == 0;
  StepResult result;
  result.set_step_id(plan.step_id());
  result.set_rank(comm_->rank());
  for (uint64_t id : plan.free_seqs()) seqs_.erase(id);
  for (uint64_t id : plan.drop_snapshots()) snapshots_.erase(id);
  if (plan.seqs_size() == 0) return result;

  std::vector<SequenceStep> batch;
  batch.reserve(plan.seqs_size());
  for (const auto& sp : plan.seqs()) {
    if (sp.tokens_size() == 0) throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " has no tokens");
    if (sp.is_new()) {
      if (seqs_.count(sp.seq_id())) throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " exists");
      Sequence s;
      if (sp.restore_snapshot()) {
        auto it = snapshots_.find(sp.restore_snapshot());
        if (it == snapshots_.end())
          throw std::runtime_error("plan: unknown prefix-cache snapshot " + std::to_string(sp.restore_snapshot()));
        s.state = it->second->Clone();
      } else {
        s.state = model_->NewState();
      }
      s.prompt_len = sp.prompt_len();
      s.params = sp.sampling();
      s.seed = sp.seed();
      if (rank0) {
        for (int i = 0; i < sp.prompt_tokens_size(); ++i) {
          if (i < sp.prompt_len()) {
            s.penalties.AddPromptToken(sp.prompt_tokens(i));
          } else if (i < sp.start_pos()) {
            s.penalties.AddOutputToken(sp.prompt_tokens(i));  // generated before a preemption, restored from cache
          }
        }
      }
      seqs_.emplace(sp.seq_id(), std::move(s));
    }
    auto it = seqs_.find(sp.seq_id());
    if (it == seqs_.end()) throw std::runtime_error("plan: unknown sequence " + std::to_string(sp.seq_id()));
    if (it->second.state->length() != sp.start_pos())
      throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " starts at " +
                               std::to_string(sp.start_pos()) + " but its state holds " +
                               std::to_string(it->second.state->length()) + " tokens");
    SequenceStep step;
    step.state = it->second.state.get();
    step.tokens.assign(sp.tokens().begin(), sp.tokens().end());
    step.all_logits = sp.return_logits();
    batch.push_back(std::move(step));
  }

  comm_->TakeSeconds();
  comm_->TakeCalls();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<SequenceOutput> outputs = model_->Forward(batch);
  result.set_forward_seconds(Since(t0));
  result.set_collective_seconds(comm_->TakeSeconds());
  result.set_collective_calls(comm_->TakeCalls());

  auto t1 = std::chrono::steady_clock::now();
  const int64_t vocab = model_->config().vocab_size;
  for (int i = 0; i < plan.seqs_size(); ++i) {
    const auto& sp = plan.seqs(i);
    Sequence& s = seqs_.at(sp.seq_id());
    if (sp.snapshot_after()) snapshots_[sp.snapshot_after()] = s.state->Clone();
    if (!rank0) continue;
    for (int j = 0; j < sp.tokens_size(); ++j)
      if (sp.start_pos() + j >= s.prompt_len) s.penalties.AddOutputToken(sp.tokens(j));
    SequenceResult* out = result.add_seqs();
    out->set_seq_id(sp.seq_id());
    out->set_token_id(-1);
    const Tensor& logits = outputs[i].logits;
    const int64_t rows = logits.shape.at(0);
    const float* data = logits.as<float>();
    if (sp.return_logits()) {
      for (int64_t r = 0; r < rows; ++r) {
        LogitsRow* row = out->add_logits();
        row->set_position(static_cast<int32_t>(sp.start_pos() + r));
        row->mutable_values()->Add(data + r * vocab, data + (r + 1) * vocab);
      }
    }
    if (sp.sample()) {
      const int64_t position = sp.start_pos() + sp.tokens_size();  // where the sampled token will sit
      SampleResult sr = SampleToken(data + (rows - 1) * vocab, vocab, s.params, s.seed, position, s.penalties);
      out->set_token_id(sr.token_id);
      if (s.params.want_logprobs() || s.params.logprobs() > 0) *out->mutable_logprobs() = std::move(sr.logprobs);
    }
  }
  result.set_sample_seconds(Since(t1));
  return result;
}

}  // namespace dsmesh

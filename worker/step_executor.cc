#include "worker/step_executor.h"

#include <chrono>
#include <optional>
#include <vector>

namespace dsmesh {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<SequenceOutput> StepExecutor::TimedForward(const std::vector<SequenceStep>& batch, StepResult* result) {
  comm_->TakeSeconds();
  comm_->TakeCalls();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<SequenceOutput> outputs = model_->Forward(batch);
  result->set_forward_seconds(Since(t0));
  result->set_collective_seconds(comm_->TakeSeconds());
  result->set_collective_calls(comm_->TakeCalls());
  return outputs;
}

StepResult StepExecutor::Run(const StepPlan& plan) {
  const bool rank0 = comm_->rank() == 0;
  StepResult result;
  result.set_step_id(plan.step_id());
  result.set_rank(comm_->rank());
  seqs_.ApplyFrees(plan);
  if (plan.seqs_size() == 0) return result;
  struct Traced {  // the step's window on the device timeline, when traced
    StepTimelineTracer* t;
    explicit Traced(StepTimelineTracer* tracer) : t(tracer) {
      if (t) t->BeginStep();
    }
    ~Traced() {
      if (t) t->EndStep();
    }
  } traced(tracer_.get());

  std::vector<SequenceStep> batch = seqs_.PrepareBatch(plan);
  const char* host_reason = sampling_.ChoosePath(plan, seqs_, &batch);
  std::vector<SequenceOutput> outputs = TimedForward(batch, &result);

  const auto t1 = std::chrono::steady_clock::now();
  const int64_t vocab = model_->config().vocab_size;
  std::vector<DraftRequest> drafts;
  std::vector<SequenceResult*> draft_out;
  std::vector<SequenceResult> locals(rank0 ? 0 : plan.seqs_size());  // other ranks verify too, report nothing
  for (int i = 0; i < plan.seqs_size(); ++i) {
    const auto& sp = plan.seqs(i);
    StepSequence& s = seqs_.at(sp.seq_id());
    seqs_.TakeSnapshot(sp);
    for (int j = 0; j < sp.tokens_size(); ++j)
      if (sp.start_pos() + j >= s.prompt_len) {
        s.penalties.AddOutputToken(sp.tokens(j));
        AdvanceGrammar(s, sp.tokens(j));
      }
    SequenceResult* out = rank0 ? result.add_seqs() : &locals[i];
    out->set_seq_id(sp.seq_id());
    out->set_token_id(-1);
    if (sp.return_logits() && rank0) {
      const float* data = outputs[i].logits.as<float>();
      for (int64_t r = 0; r < sp.tokens_size(); ++r) {
        LogitsRow* row = out->add_logits();
        row->set_position(static_cast<int32_t>(sp.start_pos() + r));
        row->mutable_values()->Add(data + r * vocab, data + (r + 1) * vocab);
      }
    }
    if (!sp.sample()) continue;
    SampleAndVerify(sp, outputs[i], host_reason, rank0, vocab, sampling_, s, out);
    if (std::optional<DraftRequest> dq = DraftRequestFor(sp, *out, vocab, s)) {
      drafts.push_back(std::move(*dq));
      draft_out.push_back(out);
    }
  }
  if (!drafts.empty()) DraftNextTokens(*model_, drafts, draft_out, draft_hook_, &result);
  result.set_sample_seconds(Since(t1));
  return result;
}

}  // namespace dsmesh

// Executes step plans on one rank: keeps every sequence's model state and the prefix-cache snapshots,
// runs the batched forward, and on rank 0 samples the next tokens. With speculative decoding every rank
// also verifies the plan's drafts on the gathered logits (greedy: accepted while equal to the argmax;
// sampled: rejection sampling, rejection_sampler.h; identical on every rank), rolls the state back to the
// accepted position and drafts the next tokens with the MTP block (greedy requests: argmax drafts; sampled
// requests: drawn from the MTP head's processed distribution). All ranks run identical plans in identical
// order (the collectives inside Forward pair up across ranks).
//
// A step in parts: sequence_table.h (plan -> batch, snapshots), step_sampling.h (device or host
// sampling, grammar masks), the forward (model.h), speculation.h (sampling and draft verification, then
// drafting).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "model/model.h"
#include "proto/mesh.pb.h"
#include "worker/mesh_communicator.h"
#include "worker/sequence_table.h"
#include "worker/speculation.h"
#include "worker/step_sampling.h"
#include "worker/step_timeline_tracer.h"

namespace dsmesh {

class StepExecutor {
 public:
  // Reads DSMESH_WORKER_TIMELINE (worker/step_timeline_tracer.h); throws on a malformed value.
  StepExecutor(Model* model, MeshCommunicator* comm)
      : model_(model),
        comm_(comm),
        sampling_(model, comm),
        seqs_(model, [this]() -> structured::GrammarCache& { return sampling_.Grammars(); }),
        tracer_(StepTimelineTracer::FromEnvironment(model->backend())) {}
  StepExecutor(const StepExecutor&) = delete;  // seqs_ calls back into this object's sampling_
  StepExecutor& operator=(const StepExecutor&) = delete;

  // Throws std::runtime_error on any inconsistency (unknown sequence, position mismatch) or model error.
  StepResult Run(const StepPlan& plan);
  // Forgets every sequence and snapshot (the mesh broke; the coordinator starts over).
  void Reset() { seqs_.Clear(); }

  // Test hook: may replace the MTP drafts of a sequence before they are returned (forced acceptances and
  // rejections). Runs on every rank; it must change them identically everywhere. A sampled request verifies
  // a replaced draft as a greedy one (one-hot q).
  // `position` is where the first draft would sit.
  void set_draft_hook(DraftHook hook) { draft_hook_ = std::move(hook); }

  // Whether plans may carry simulated draft acceptance (SequencePlan.simulated_acceptance): only a worker
  // that `dsmesh bench --draft-acceptance` started (dsmesh-worker --bench-simulated-acceptance); any other
  // refuses such a plan, so serving never emits tokens the bench's generator chose.
  void set_simulated_acceptance_allowed(bool on) { seqs_.set_simulated_acceptance_allowed(on); }

  // Where the tokenizer for constrained decoding is loaded from (the model directory), on first use.
  void set_tokenizer_dir(std::string dir) { sampling_.set_tokenizer_dir(std::move(dir)); }
  void set_tokenizer(std::shared_ptr<const Tokenizer> tokenizer) { sampling_.set_tokenizer(std::move(tokenizer)); }

  // Rows sampled on the backend (Backend::SampleRows: only tokens and logprobs leave the device) rather
  // than from logits copied to the host. A step goes to the device when every row of it can: no
  // penalties, no grammar mask, no raw logits asked for, no sampled drafts to verify (greedy drafts are
  // verified by the device's argmax), one rank. Each path logs once, the host path with its reason.
  void set_device_sampling(bool on) { sampling_.set_device_sampling(on); }
  using SamplingCounts = StepSampling::Counts;
  SamplingCounts sampling_counts() const { return sampling_.counts(); }

  size_t num_sequences() const { return seqs_.num_sequences(); }
  size_t num_snapshots() const { return seqs_.num_snapshots(); }
  size_t StateBytes() const { return seqs_.StateBytes(); }

 private:
  // The forward of `batch`, timed (forward and collective seconds and calls into `result`).
  std::vector<SequenceOutput> TimedForward(const std::vector<SequenceStep>& batch, StepResult* result);

  Model* model_;
  MeshCommunicator* comm_;
  StepSampling sampling_;
  SequenceTable seqs_;
  DraftHook draft_hook_;
  std::unique_ptr<StepTimelineTracer> tracer_;  // null unless DSMESH_WORKER_TIMELINE asks for one
};

}  // namespace dsmesh

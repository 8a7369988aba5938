// Speculative decoding in the step executor: sampling a sequence's rows while verifying the plan's drafts
// against them, and drafting the next step's tokens with the MTP block. Every rank runs both on the same
// logits with the same seeds, so all reach the same tokens and roll their states back alike.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/model.h"
#include "proto/mesh.pb.h"
#include "worker/step_sampling.h"
#include "worker/step_sequence.h"

namespace dsmesh {

// StepExecutor::set_draft_hook's: may replace the drafts of `seq_id` whose first sits at `position`.
using DraftHook = std::function<void(uint64_t seq_id, int64_t position, std::vector<int32_t>* drafts)>;

// Samples the tokens of a sampling sequence `sp` from its forward output, verifying its drafts: greedy
// requests accept a draft while it equals the argmax; sampled requests by rejection sampling against the
// distribution the draft was drawn from; with simulated acceptance (bench only) the plan decides. Fills
// `out` (token_id, token_ids, logprobs when `report_logprobs`, num_accepted_drafts), feeds the accepted
// drafts to the penalties and grammar, and rolls the state back past the rejected ones.
// `host_reason`: why the step was sampled on the host (nullptr: on the device or tensor-parallel).
void SampleAndVerify(const SequencePlan& sp, const SequenceOutput& output, const char* host_reason,
                     bool report_logprobs, int64_t vocab, StepSampling& sampling, StepSequence& s,
                     SequenceResult* out);

// The MTP drafts `s` wants after this step (its speculative tokens less those the plan withholds), from
// the last token `out` produced; nullopt when none. Sampled requests draw their drafts from the MTP head's
// processed distribution and keep it in `s` for the next step's verification.
std::optional<DraftRequest> DraftRequestFor(const SequencePlan& sp, const SequenceResult& out, int64_t vocab,
                                            StepSequence& s);

// Runs the MTP block for `requests` and appends each one's drafts to its `outs[k]` (next_drafts), after
// the hook (if any) had its say. Sets result->draft_seconds.
void DraftNextTokens(Model& model, const std::vector<DraftRequest>& requests, const std::vector<SequenceResult*>& outs,
                     const DraftHook& hook, StepResult* result);

}  // namespace dsmesh

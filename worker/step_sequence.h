// What the step executor keeps about one running sequence between steps: its model state, the request's
// sampling parameters, the penalty counts and grammar state of the tokens it holds, and the drafts this
// rank drew last step (with their distributions, for verification). Every rank keeps the same.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/structured/token_grammar.h"
#include "model/model.h"
#include "proto/mesh.pb.h"
#include "worker/sampler.h"

namespace dsmesh {

struct StepSequence {
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

// Moves the grammar state past a fed or produced token (no-op without a grammar or once it was left).
inline void AdvanceGrammar(StepSequence& s, int32_t token) {
  if (s.grammar && s.grammar_state >= 0) s.grammar_state = s.grammar->AdvanceToken(s.grammar_state, token);
}

}  // namespace dsmesh

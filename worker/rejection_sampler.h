// Verification of one draft token by rejection sampling (Leviathan et al., arXiv 2211.17192), with the
// semantics of vLLM's rejection sampler: p is the target's processed distribution at the draft's position
// (ProcessedDist of the target logits), q the distribution the draft was drawn from (the MTP head's
// ProcessedDist, or one-hot at the draft for a greedy draft). The draft is accepted with probability
// min(1, p(d) / q(d)); otherwise the position gets a recovery token drawn from normalize(max(p - q, 0)). The
// token at every position is then distributed as p, whatever q is. Random numbers come from the
// (seed, position) streams kAccept and kRecover, so a seeded request verifies reproducibly.
#pragma once

#include <cstdint>

#include "worker/sampler.h"

namespace dsmesh {

struct DraftVerdict {
  bool accepted = false;
  int32_t token_id = -1;  // the draft when accepted, else the recovery token
};

// `q` == nullptr: the draft is greedy (q one-hot at `draft`); then the draft is accepted with probability
// p(draft), and the recovery token is drawn from p with the draft's probability removed.
DraftVerdict VerifyDraft(const TokenDist& p, int32_t draft, const TokenDist* q, uint64_t seed, int64_t position);

}  // namespace dsmesh

#include "worker/speculation.h"

#include <algorithm>
#include <chrono>

#include "kernels/sampling/random_stream.h"
#include "worker/rejection_sampler.h"

namespace dsmesh {

void SampleAndVerify(const SequencePlan& sp, const SequenceOutput& output, const char* host_reason,
                     bool report_logprobs, int64_t vocab, StepSampling& sampling, StepSequence& s,
                     SequenceResult* out) {
  const Tensor& logits = output.logits;
  const std::vector<SampledRow>& sampled = output.samples;
  const bool on_device = !sampled.empty();
  const int64_t rows = on_device ? static_cast<int64_t>(sampled.size()) : logits.shape.at(0);
  const float* data = on_device ? nullptr : logits.as<float>();
  // Row r of the verified rows predicts position start + tokens + r; draft r sits there. Greedy requests
  // accept a draft while it equals the argmax (rejection sampling with one-hot p and q: exactly plain
  // greedy); sampled requests verify each draft by rejection sampling against the distribution it was
  // drawn from. The first rejection ends the row with its recovery token; the row after the last draft
  // is the plain sample (the bonus token when every draft passed).
  const int64_t first = rows - 1 - sp.draft_tokens_size();
  const int64_t position = sp.start_pos() + sp.tokens_size();  // where the first sampled token will sit
  const int n = sp.draft_tokens_size();
  const bool greedy = s.params.temperature() < 1e-5f;
  // Simulated acceptance (bench only): drafts 0 .. sim-1 pass whatever they were, each emitting the
  // target's own token at its row (what a passing draft emits); draft sim, if any, is rejected and its row's
  // token is the correction. The rows after a substituted draft were computed on the draft as fed, which
  // changes the text, not the work. -1: verify for real.
  const int sim = sp.has_simulated_acceptance() ? std::min(sp.simulated_acceptance().accepted_drafts(), n) : -1;
  const bool want_logprobs = report_logprobs && (s.params.want_logprobs() || s.params.logprobs() > 0);
  int accepted = 0;
  sampling.CountRows(on_device, n + 1, on_device ? nullptr : host_reason ? host_reason : "tensor-parallel step");
  for (int r = 0; r <= n; ++r) {
    if (on_device) {
      // Sampled where the logits are (greedy, or a plain draw: no drafts then), by the same rules.
      const SampledRow& row = sampled[first + r];
      if (r == n && r == 0 && want_logprobs) ToTokenLogprobs(row, out->mutable_logprobs());
      const bool pass = r < n && (sim >= 0 ? r < sim : row.token == sp.draft_tokens(r));
      if (r == 0) out->set_token_id(row.token);
      out->add_token_ids(row.token);
      if (!pass) break;
      s.penalties.AddOutputToken(row.token);
      AdvanceGrammar(s, row.token);
      ++accepted;
      continue;
    }
    const float* row = data + (first + r) * vocab;
    // Constrained: the row's logits outside the grammar (at the state after the drafts accepted so far)
    // are -inf, so a draft that leaves the grammar is rejected and every produced token stays inside.
    if (s.grammar) row = sampling.MaskRow(s, s.grammar_state, position + r - s.prompt_len, row, vocab);
    int32_t token;
    bool pass = false;
    if (r == n) {
      SampleResult sr = SampleToken(row, vocab, s.params, s.seed, position + r, s.penalties);
      token = sr.token_id;
      // Only a row without drafts gets here with r == 0 (requests with logprobs do not speculate).
      if (r == 0 && want_logprobs) *out->mutable_logprobs() = std::move(sr.logprobs);
    } else if (greedy || sim >= 0) {
      // (simulated: the target's own token, a plain sample at this position for a sampled request)
      token = SampleToken(row, vocab, s.params, s.seed, position + r, s.penalties).token_id;
      pass = sim >= 0 ? r < sim : token == sp.draft_tokens(r);
    } else {
      // q is the distribution this executor drew the draft from; a draft it did not draw (the test hook
      // replaced it) counts as greedy (one-hot q).
      const bool drawn = r < (int)s.drawn_drafts.size() && s.drawn_drafts[r] == sp.draft_tokens(r);
      const TokenDist p = ProcessedDist(row, vocab, s.params, s.penalties);
      const DraftVerdict v =
          VerifyDraft(p, sp.draft_tokens(r), drawn ? &s.draft_dists[r] : nullptr, s.seed, position + r);
      token = v.token_id;
      pass = v.accepted;
    }
    if (r == 0) out->set_token_id(token);
    out->add_token_ids(token);
    if (!pass) break;
    s.penalties.AddOutputToken(token);  // an accepted draft was fed like any generated token
    AdvanceGrammar(s, token);
    ++accepted;
  }
  s.drawn_drafts.clear();
  s.draft_dists.clear();
  out->set_num_accepted_drafts(accepted);
  if (sp.draft_tokens_size() > 0) s.state->Rollback(sp.start_pos() + sp.tokens_size() + accepted);
}

std::optional<DraftRequest> DraftRequestFor(const SequencePlan& sp, const SequenceResult& out, int64_t vocab,
                                            StepSequence& s) {
  // The speculation policy may withhold drafts (down to none: the MTP block then skips this step and
  // catches up on its window when drafting resumes).
  const int want = s.speculative_tokens - std::clamp(sp.drafts_withheld(), 0, s.speculative_tokens);
  if (want <= 0) return std::nullopt;
  DraftRequest dq{s.state.get(), out.token_ids(out.token_ids_size() - 1), want};
  const bool greedy = s.params.temperature() < 1e-5f;
  if (!greedy) {
    // Sampled drafts: draft i (at position length + 1 + i) is drawn from the MTP head's processed
    // distribution (the request's penalties, temperature, min_p, top_k, top_p, with the tokens before it
    // counted), by the (seed, position) kDraft stream; that distribution is kept as q for verification.
    PenaltyState pen = s.penalties;
    pen.AddOutputToken(dq.next_token);
    dq.choose = [&s, pen, base = s.state->length() + 1, vocab](int step, const float* logits) mutable {
      TokenDist q = ProcessedDist(logits, vocab, s.params, pen);
      const int32_t d = DrawToken(q, Uniform01(s.seed, base + step, RandomStream::kDraft));
      pen.AddOutputToken(d);
      s.drawn_drafts.push_back(d);
      s.draft_dists.push_back(std::move(q));
      return d;
    };
  }
  return dq;
}

void DraftNextTokens(Model& model, const std::vector<DraftRequest>& requests, const std::vector<SequenceResult*>& outs,
                     const DraftHook& hook, StepResult* result) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<DraftResult> dr = model.Draft(requests);
  result->set_draft_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  for (size_t k = 0; k < dr.size(); ++k) {
    if (hook) hook(outs[k]->seq_id(), requests[k].state->length() + 1, &dr[k].tokens);
    for (int32_t t : dr[k].tokens) outs[k]->add_next_drafts(t);
  }
}

}  // namespace dsmesh

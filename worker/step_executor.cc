#include "worker/step_executor.h"

#include "kernels/sampling/random_stream.h"
#include "worker/plan_images.h"
#include "worker/rejection_sampler.h"
#include "kernels/backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace dsmesh {
namespace {

std::vector<int32_t> Table(const google::protobuf::RepeatedField<int32_t>& t) { return {t.begin(), t.end()}; }
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

structured::GrammarCache& StepExecutor::Grammars() {
  if (!grammars_) {
    if (!tokenizer_) {
      if (tokenizer_dir_.empty()) throw std::runtime_error("constrained decoding needs the tokenizer (set_tokenizer_dir)");
      tokenizer_ = Tokenizer::Load(tokenizer_dir_);
    }
    grammars_ = std::make_unique<structured::GrammarCache>(tokenizer_, model_->config().vocab_size);
  }
  return *grammars_;
}

const float* StepExecutor::MaskRow(Sequence& s, int32_t state, int64_t generated, const float* row, int64_t vocab) {
  masked_.assign(vocab, -std::numeric_limits<float>::infinity());
  const int64_t budget = s.params.max_tokens() > 0 ? s.params.max_tokens() : (int64_t{1} << 30);
  if (state < 0) {
    // Left the grammar (cannot happen for tokens drawn under the mask): end the output.
    if (const auto eos = tokenizer_->eos_id()) masked_[*eos] = row[*eos];
    return masked_.data();
  }
  const uint64_t* m = s.grammar->Mask(state, std::max<int64_t>(1, budget - generated), &mask_scratch_);
  const size_t words = std::min<size_t>(s.grammar->words(), (vocab + 63) / 64);
  for (size_t w = 0; w < words; ++w)
    for (uint64_t b = m[w]; b; b &= b - 1) {
      const int64_t t = static_cast<int64_t>(w * 64 + __builtin_ctzll(b));
      if (t < vocab) masked_[t] = row[t];
    }
  return masked_.data();
}

const char* StepExecutor::HostSamplingReason(const SequencePlan& sp, const Sequence& s) {
  const SamplingParams& p = s.params;
  if (sp.return_logits()) return "raw logits requested";
  if (s.grammar) return "structured output (grammar mask)";
  if ((p.repetition_penalty() != 0 && p.repetition_penalty() != 1.0f) || p.frequency_penalty() != 0 ||
      p.presence_penalty() != 0)
    return "penalties";
  if (sp.draft_tokens_size() > 0 && p.temperature() >= sampling::kGreedyTemperature)
    return "sampled speculative drafts (rejection sampling needs the distribution)";
  if (p.logprobs() > sampling::kMaxTopLogprobs) return "more top logprobs than the device returns";
  return nullptr;
}

void StepExecutor::CountSampledRows(bool on_device, int64_t rows, const char* host_reason) {
  (on_device ? sampling_counts_.device_rows : sampling_counts_.host_rows) += rows;
  const std::string path = on_device ? std::string("device") : std::string("host: ") + host_reason;
  if (!logged_sampling_paths_.insert(path).second) return;
  if (on_device) {
    std::fprintf(stderr, "[worker %d/%d] sampling on %s: only sampled tokens and logprobs leave it (logged once)\n",
                 comm_->rank(), comm_->world(), model_->backend().name().c_str());
  } else {
    std::fprintf(stderr, "[worker %d/%d] sampling on the host from full logits: %s (logged once per reason)\n",
                 comm_->rank(), comm_->world(), host_reason);
  }
}

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

  // With the coordinator planning the state pool, every state lives in the slot and blocks it is sent.
  const bool external = model_->state_pool().external();
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
        s.state = external ? it->second->CloneInto(sp.state_slot(), Table(sp.block_table()))
                           : it->second->Clone();
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
          s.grammar = Grammars().Get(sp.sampling().structured_output());
        } catch (const structured::GrammarError& e) {
          throw std::runtime_error(std::string("plan: sequence structured_output: ") + e.what());
        }
        s.grammar_state = s.grammar->start();
      }
      {
        for (int i = 0; i < sp.prompt_tokens_size(); ++i) {
          if (i < sp.prompt_len()) {
            s.penalties.AddPromptToken(sp.prompt_tokens(i));
          } else if (i < sp.start_pos()) {
            s.penalties.AddOutputToken(sp.prompt_tokens(i));  // generated before a preemption, restored from cache
            Advance(s, sp.prompt_tokens(i));
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
    // Simulated acceptance is the bench's (`dsmesh bench --draft-acceptance`): only a worker started by the
    // bench (--bench-simulated-acceptance) takes it, so a serving mesh can never emit tokens it decided.
    if (sp.has_simulated_acceptance() && !simulated_acceptance_allowed_)
      throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) +
                               " carries simulated draft acceptance, a bench-only path (dsmesh bench "
                               "--draft-acceptance); this worker was not started for the bench");
    if (sp.has_simulated_acceptance() && sp.simulated_acceptance().accepted_drafts() < 0)
      throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " simulates a negative acceptance");
    if (sp.draft_tokens_size() > 0 &&
        (sp.tokens_size() != 1 || !sp.sample() || sp.draft_tokens_size() > it->second.speculative_tokens))
      throw std::runtime_error("plan: sequence " + std::to_string(sp.seq_id()) + " has " +
                               std::to_string(sp.draft_tokens_size()) + " drafts after " +
                               std::to_string(sp.tokens_size()) + " tokens (speculating " +
                               std::to_string(it->second.speculative_tokens) + ")");
    if (external) it->second.state->SetBlockTable(Table(sp.block_table()));
    SequenceStep step;
    step.state = it->second.state.get();
    step.tokens.assign(sp.tokens().begin(), sp.tokens().end());
    step.tokens.insert(step.tokens.end(), sp.draft_tokens().begin(), sp.draft_tokens().end());
    step.all_logits = sp.return_logits() || sp.draft_tokens_size() > 0;
    step.images = ImageRowsForChunk(*model_, sp);
    batch.push_back(std::move(step));
  }
  // Sample on the device when every row of the step allows it (the model then returns tokens, not logits).
  const char* host_reason = device_sampling_ ? nullptr : "device sampling turned off";
  for (int i = 0; i < plan.seqs_size() && !host_reason; ++i)
    host_reason = HostSamplingReason(plan.seqs(i), seqs_.at(plan.seqs(i).seq_id()));
  if (!host_reason)
    for (int i = 0; i < plan.seqs_size(); ++i) {
      const auto& sp = plan.seqs(i);
      const Sequence& s = seqs_.at(sp.seq_id());
      // Row 0 of the sequence's logits predicts the token after its first fed token when every row has
      // logits (drafts), else the one after its last.
      const int64_t first = sp.draft_tokens_size() > 0 ? sp.start_pos() + 1 : sp.start_pos() + sp.tokens_size();
      batch[i].sampling = RowSamplingOf(s.params, s.seed, first);
      if (!sp.sample()) batch[i].sampling->temperature = 0;  // a prefill chunk that samples nothing: argmax is cheapest
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
  std::vector<DraftRequest> drafts;
  std::vector<SequenceResult*> draft_out;
  std::vector<SequenceResult> locals(rank0 ? 0 : plan.seqs_size());  // other ranks verify too, report nothing
  for (int i = 0; i < plan.seqs_size(); ++i) {
    const auto& sp = plan.seqs(i);
    Sequence& s = seqs_.at(sp.seq_id());
    if (sp.snapshot_after())
      snapshots_[sp.snapshot_after()] = external ? s.state->CloneInto(sp.snapshot_slot(), Table(sp.snapshot_blocks()))
                                                 : s.state->Clone();
    for (int j = 0; j < sp.tokens_size(); ++j)
      if (sp.start_pos() + j >= s.prompt_len) {
        s.penalties.AddOutputToken(sp.tokens(j));
        Advance(s, sp.tokens(j));
      }
    SequenceResult* out = rank0 ? result.add_seqs() : &locals[i];
    out->set_seq_id(sp.seq_id());
    out->set_token_id(-1);
    const Tensor& logits = outputs[i].logits;
    const std::vector<SampledRow>& sampled = outputs[i].samples;
    const bool on_device = !sampled.empty();
    const int64_t rows = on_device ? static_cast<int64_t>(sampled.size()) : logits.shape.at(0);
    const float* data = on_device ? nullptr : logits.as<float>();
    if (sp.return_logits() && rank0) {
      for (int64_t r = 0; r < sp.tokens_size(); ++r) {
        LogitsRow* row = out->add_logits();
        row->set_position(static_cast<int32_t>(sp.start_pos() + r));
        row->mutable_values()->Add(data + r * vocab, data + (r + 1) * vocab);
      }
    }
    if (!sp.sample()) continue;
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
    int accepted = 0;
    CountSampledRows(on_device, n + 1, on_device ? nullptr : host_reason ? host_reason : "tensor-parallel step");
    for (int r = 0; r <= n; ++r) {
      if (on_device) {
        // Sampled where the logits are (greedy, or a plain draw: no drafts then), by the same rules.
        const SampledRow& row = sampled[first + r];
        if (r == n && r == 0 && rank0 && (s.params.want_logprobs() || s.params.logprobs() > 0))
          ToTokenLogprobs(row, out->mutable_logprobs());
        const bool pass = r < n && (sim >= 0 ? r < sim : row.token == sp.draft_tokens(r));
        if (r == 0) out->set_token_id(row.token);
        out->add_token_ids(row.token);
        if (!pass) break;
        s.penalties.AddOutputToken(row.token);
        Advance(s, row.token);
        ++accepted;
        continue;
      }
      const float* row = data + (first + r) * vocab;
      // Constrained: the row's logits outside the grammar (at the state after the drafts accepted so far)
      // are -inf, so a draft that leaves the grammar is rejected and every produced token stays inside.
      if (s.grammar) row = MaskRow(s, s.grammar_state, position + r - s.prompt_len, row, vocab);
      int32_t token;
      bool pass = false;
      if (r == n) {
        SampleResult sr = SampleToken(row, vocab, s.params, s.seed, position + r, s.penalties);
        token = sr.token_id;
        // Only a row without drafts gets here with r == 0 (requests with logprobs do not speculate).
        if (r == 0 && rank0 && (s.params.want_logprobs() || s.params.logprobs() > 0))
          *out->mutable_logprobs() = std::move(sr.logprobs);
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
      Advance(s, token);
      ++accepted;
    }
    s.drawn_drafts.clear();
    s.draft_dists.clear();
    out->set_num_accepted_drafts(accepted);
    if (sp.draft_tokens_size() > 0) s.state->Rollback(sp.start_pos() + sp.tokens_size() + accepted);
    // The speculation policy may withhold drafts (down to none: the MTP block then skips this step and
    // catches up on its window when drafting resumes).
    const int want = s.speculative_tokens - std::clamp(sp.drafts_withheld(), 0, s.speculative_tokens);
    if (want > 0) {
      DraftRequest dq{s.state.get(), out->token_ids(out->token_ids_size() - 1), want};
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
      drafts.push_back(std::move(dq));
      draft_out.push_back(out);
    }
  }
  if (!drafts.empty()) {
    const auto td = std::chrono::steady_clock::now();
    std::vector<DraftResult> dr = model_->Draft(drafts);
    result.set_draft_seconds(Since(td));
    for (size_t k = 0; k < dr.size(); ++k) {
      if (draft_hook_) draft_hook_(draft_out[k]->seq_id(), drafts[k].state->length() + 1, &dr[k].tokens);
      for (int32_t t : dr[k].tokens) draft_out[k]->add_next_drafts(t);
    }
  }
  result.set_sample_seconds(Since(t1));
  return result;
}

}  // namespace dsmesh

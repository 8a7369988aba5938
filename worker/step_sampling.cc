#include "worker/step_sampling.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "kernels/backend.h"

namespace dsmesh {

structured::GrammarCache& StepSampling::Grammars() {
  if (!grammars_) {
    if (!tokenizer_) {
      if (tokenizer_dir_.empty()) throw std::runtime_error("constrained decoding needs the tokenizer (set_tokenizer_dir)");
      tokenizer_ = Tokenizer::Load(tokenizer_dir_);
    }
    grammars_ = std::make_unique<structured::GrammarCache>(tokenizer_, model_->config().vocab_size);
  }
  return *grammars_;
}

const float* StepSampling::MaskRow(const StepSequence& s, int32_t state, int64_t generated, const float* row,
                                   int64_t vocab) {
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

const char* StepSampling::HostSamplingReason(const SequencePlan& sp, const StepSequence& s) {
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

const char* StepSampling::ChoosePath(const StepPlan& plan, const SequenceTable& seqs,
                                     std::vector<SequenceStep>* batch) const {
  const char* host_reason = device_sampling_ ? nullptr : "device sampling turned off";
  for (int i = 0; i < plan.seqs_size() && !host_reason; ++i)
    host_reason = HostSamplingReason(plan.seqs(i), seqs.at(plan.seqs(i).seq_id()));
  if (host_reason) return host_reason;
  for (int i = 0; i < plan.seqs_size(); ++i) {
    const auto& sp = plan.seqs(i);
    const StepSequence& s = seqs.at(sp.seq_id());
    // Row 0 of the sequence's logits predicts the token after its first fed token when every row has
    // logits (drafts), else the one after its last.
    const int64_t first = sp.draft_tokens_size() > 0 ? sp.start_pos() + 1 : sp.start_pos() + sp.tokens_size();
    (*batch)[i].sampling = RowSamplingOf(s.params, s.seed, first);
    if (!sp.sample()) (*batch)[i].sampling->temperature = 0;  // a prefill chunk that samples nothing: argmax is cheapest
  }
  return nullptr;
}

void StepSampling::CountRows(bool on_device, int64_t rows, const char* host_reason) {
  (on_device ? counts_.device_rows : counts_.host_rows) += rows;
  const std::string path = on_device ? std::string("device") : std::string("host: ") + host_reason;
  if (!logged_paths_.insert(path).second) return;
  if (on_device) {
    std::fprintf(stderr, "[worker %d/%d] sampling on %s: only sampled tokens and logprobs leave it (logged once)\n",
                 comm_->rank(), comm_->world(), model_->backend().name().c_str());
  } else {
    std::fprintf(stderr, "[worker %d/%d] sampling on the host from full logits: %s (logged once per reason)\n",
                 comm_->rank(), comm_->world(), host_reason);
  }
}

}  // namespace dsmesh

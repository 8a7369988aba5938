// Sampled requests with MTP speculation on the tiny model, driven through the step executor the way the
// coordinator drives it:
// - the first three sampled tokens (temperature 1, top_k, repetition and frequency penalties) follow the
//   distribution of plain sampling: their exact joint distribution is computed from the model with the
//   plain sampler's ProcessedDist, and 3000 seeds with speculation on (3 drafts: rejection sampling against
//   the MTP head's distribution) and off are each compared with it by chi-square. Two models: vocab 512
//   with top_k 4 (the random MTP head's top 4 rarely meets the target's: nearly every draft is rejected
//   and recovered) and vocab 16 with top_k 6 (the distributions overlap: drafts are often accepted), also
//   with drafts over ids < 8 only (draft_vocab_size);
// - a seeded request with speculation on gives the same tokens on every run and whatever it is batched with.
//
// Error rate: each chi-square check fails a correct implementation with probability ~1e-4 over seeds (the
// critical value is the 1 - 1e-4 quantile, Wilson-Hilferty approximation, within 1% at these degrees of
// freedom); the seeds are fixed, so a run's result is deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "kernels/cpu/cpu_backend.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"
#include "worker/step_executor.h"

namespace dsmesh {
namespace {

using namespace testing_util;


SamplingParams Sampled(int top_k = 4) {
  SamplingParams p;
  p.set_temperature(1.0f);
  p.set_top_k(top_k);
  p.set_repetition_penalty(1.3f);
  p.set_frequency_penalty(0.5f);
  return p;
}

// One request in the coordinator's loop.
struct Stream {
  uint64_t seq_id = 0;
  std::vector<int32_t> prompt;
  uint64_t seed = 0;
  uint64_t restore = 0;  // start from this snapshot (it holds prompt[0 .. P-2])
  std::vector<int32_t> tokens, drafts;
  int64_t computed = 0;
  bool started = false;
};

class SpeculativeSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_.Attach(std::make_unique<LocalCommunicator>());
    Load(512);
  }

  void Load(int64_t vocab) {
    TinyModelSpec spec = SmallSpec();
    spec.vocab_size = vocab;
    const std::string dir = TempDir("speculative_sampling_test_model_" + std::to_string(vocab));
    WriteTinyModel(dir, 23, spec);
    model_ = LoadModel(dir, ShardSpec{}, MakeCpuBackend(1), &comm_);
    vocab_ = model_->config().vocab_size;
  }

  // Runs the streams together until each has n generated tokens; frees them. Counts drafts and acceptances.
  void Generate(StepExecutor& ex, std::vector<Stream*> streams, int n, int k, const SamplingParams& params) {
    for (Stream* s : streams) {
      s->tokens = s->prompt;
      s->computed = s->restore ? static_cast<int64_t>(s->prompt.size()) - 1 : 0;
    }
    auto done = [&](const Stream* s) { return s->tokens.size() >= s->prompt.size() + n; };
    StepPlan plan;
    for (bool more = true; more;) {
      more = false;
      plan.Clear();
      plan.set_step_id(step_++);
      std::vector<Stream*> in;
      for (Stream* s : streams) {
        if (done(s)) continue;
        SequencePlan* sp = plan.add_seqs();
        sp->set_seq_id(s->seq_id);
        sp->set_start_pos(s->computed);
        sp->set_sample(true);
        if (!s->started) {
          sp->set_is_new(true);
          sp->set_restore_snapshot(s->restore);
          sp->set_prompt_len(s->prompt.size());
          sp->mutable_prompt_tokens()->Add(s->prompt.begin(), s->prompt.end());
          *sp->mutable_sampling() = params;
          sp->set_seed(s->seed);
          sp->set_num_speculative_tokens(k);
          s->started = true;
        }
        sp->mutable_tokens()->Add(s->tokens.begin() + s->computed, s->tokens.end());
        sp->mutable_draft_tokens()->Add(s->drafts.begin(), s->drafts.end());
        drafts_ += s->drafts.size();
        in.push_back(s);
      }
      if (in.empty()) break;
      StepResult r = ex.Run(plan);
      for (size_t i = 0; i < in.size(); ++i) {
        const SequenceResult& sr = r.seqs(i);
        Stream* s = in[i];
        s->computed = s->tokens.size() + sr.num_accepted_drafts();
        accepted_ += sr.num_accepted_drafts();
        s->tokens.insert(s->tokens.end(), sr.token_ids().begin(), sr.token_ids().end());
        s->drafts.assign(sr.next_drafts().begin(), sr.next_drafts().end());
        more |= !done(s);
      }
    }
    plan.Clear();
    plan.set_step_id(step_++);
    for (Stream* s : streams) {
      plan.add_free_seqs(s->seq_id);
      s->tokens.erase(s->tokens.begin(), s->tokens.begin() + s->prompt.size());
      s->tokens.resize(n);
    }
    ex.Run(plan);
  }

  // Keeps the state after prompt[0 .. P-2] as snapshot `id` (streams restore it and feed the last token).
  void Snapshot(StepExecutor& ex, const std::vector<int32_t>& prompt, uint64_t id, int k,
                const SamplingParams& params) {
    StepPlan plan;
    plan.set_step_id(step_++);
    SequencePlan* sp = plan.add_seqs();
    sp->set_seq_id(id);
    sp->set_is_new(true);
    sp->set_prompt_len(prompt.size());
    sp->mutable_prompt_tokens()->Add(prompt.begin(), prompt.end());
    *sp->mutable_sampling() = params;
    sp->set_num_speculative_tokens(k);
    sp->mutable_tokens()->Add(prompt.begin(), prompt.end() - 1);
    sp->set_snapshot_after(id);
    ex.Run(plan);
    plan.Clear();
    plan.set_step_id(step_++);
    plan.add_free_seqs(id);
    ex.Run(plan);
  }

  // The exact joint distribution of the first three sampled tokens without speculation.
  std::map<std::vector<int32_t>, double> Exact(const std::vector<int32_t>& prompt, const SamplingParams& params) {
    std::map<std::vector<int32_t>, double> joint;
    PenaltyState pen;
    for (int32_t t : prompt) pen.AddPromptToken(t);
    auto root = model_->NewState();
    Tensor l0 = model_->Forward({{root.get(), prompt, false}})[0].logits;
    const TokenDist p1 = ProcessedDist(l0.as<float>(), vocab_, params, pen);
    for (size_t a = 0; a < p1.ids.size(); ++a) {
      auto s1 = root->Clone();
      Tensor l1 = model_->Forward({{s1.get(), {p1.ids[a]}, false}})[0].logits;
      PenaltyState pen1 = pen;
      pen1.AddOutputToken(p1.ids[a]);
      const TokenDist p2 = ProcessedDist(l1.as<float>(), vocab_, params, pen1);
      for (size_t b = 0; b < p2.ids.size(); ++b) {
        auto s2 = s1->Clone();
        Tensor l2 = model_->Forward({{s2.get(), {p2.ids[b]}, false}})[0].logits;
        PenaltyState pen2 = pen1;
        pen2.AddOutputToken(p2.ids[b]);
        const TokenDist p3 = ProcessedDist(l2.as<float>(), vocab_, params, pen2);
        for (size_t c = 0; c < p3.ids.size(); ++c)
          joint[{p1.ids[a], p2.ids[b], p3.ids[c]}] = p1.prob(a) * p2.prob(b) * p3.prob(c);
      }
    }
    return joint;
  }

  // Chi-square of the counts against the exact distribution; outcomes expected < 5 times share one bin.
  static void ExpectFits(const std::map<std::vector<int32_t>, double>& exact,
                         const std::map<std::vector<int32_t>, int>& counts, int n, const std::string& what) {
    double chi2 = 0, small_e = 0, small_o = 0;
    int bins = 0, seen = 0;
    for (const auto& [key, p] : exact) {
      auto it = counts.find(key);
      const double o = it == counts.end() ? 0 : it->second;
      seen += static_cast<int>(o);
      const double e = n * p;
      if (e < 5) {
        small_e += e;
        small_o += o;
        continue;
      }
      chi2 += (o - e) * (o - e) / e;
      ++bins;
    }
    EXPECT_EQ(seen, n) << what << ": outcomes the plain sampler cannot produce";
    if (small_e > 0) {
      chi2 += (small_o - small_e) * (small_o - small_e) / small_e;
      ++bins;
    }
    const double df = bins - 1, z = 3.719;  // upper 1e-4 normal quantile
    const double critical = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
    EXPECT_LT(chi2, critical) << what << ": chi-square " << chi2 << " over " << bins << " bins";
    std::printf("%s: chi-square %.1f, %d bins, critical (p = 1e-4) %.1f\n", what.c_str(), chi2, bins, critical);
  }

  // 3000 seeds with k drafts against the exact distribution; returns the fraction of drafts accepted.
  double CheckFirstTokens(int k, int top_k, const std::string& what) {
    const auto prompt = Tokens(12, static_cast<int>(vocab_), 5);
    const SamplingParams params = Sampled(top_k);
    const auto exact = Exact(prompt, params);
    const int n = 3000;
    StepExecutor ex(model_.get(), &comm_);
    Snapshot(ex, prompt, 7, k, params);
    drafts_ = accepted_ = 0;
    std::map<std::vector<int32_t>, int> counts;
    for (int i = 0; i < n; ++i) {
      Stream s;
      s.seq_id = 100 + i;
      s.prompt = prompt;
      s.seed = 1000 + i;
      s.restore = 7;
      Generate(ex, {&s}, 3, k, params);
      ++counts[s.tokens];
    }
    ExpectFits(exact, counts, n, what);
    if (k == 0) return 0;
    std::printf("%s: %lld drafts, %lld accepted\n", what.c_str(), (long long)drafts_, (long long)accepted_);
    EXPECT_GT(drafts_, 2 * n);
    return static_cast<double>(accepted_) / drafts_;
  }

  MeshCommunicator comm_{0, 1};
  std::unique_ptr<Model> model_;
  int64_t vocab_ = 0;
  int64_t step_ = 0;
  int64_t drafts_ = 0, accepted_ = 0;
};

TEST_F(SpeculativeSamplingTest, FirstSampledTokensFollowPlainSamplingWithAndWithoutSpeculation) {
  CheckFirstTokens(0, 4, "vocab 512, top_k 4, speculation off");
  EXPECT_LT(CheckFirstTokens(3, 4, "vocab 512, top_k 4, speculation on"), 0.05);  // mostly recovery tokens
  Load(16);
  CheckFirstTokens(0, 6, "vocab 16, top_k 6, speculation off");
  EXPECT_GT(CheckFirstTokens(3, 6, "vocab 16, top_k 6, speculation on"), 0.05);  // many accepted drafts (11%)
  // Drafts over ids < 8 only (draft_vocab_size): q has no mass on ids 8..15, which the target still
  // reaches through the recovery draws; the tokens keep the plain distribution.
  ASSERT_EQ(model_->SetDraftVocabulary(8), 8);
  EXPECT_GT(CheckFirstTokens(3, 6, "vocab 16, top_k 6, speculation on, draft vocabulary 8"), 0.02);
}

TEST_F(SpeculativeSamplingTest, SeededRequestsAreReproducibleWithSpeculation) {
  const auto prompt = Tokens(20, 512, 8), other = Tokens(33, 512, 9);
  SamplingParams p = Sampled();
  p.set_top_k(0);  // the whole vocabulary
  p.set_top_p(0.95f);
  auto run = [&](uint64_t seed, bool batched) {
    StepExecutor ex(model_.get(), &comm_);
    Stream s, o;
    s.seq_id = 1;
    s.prompt = prompt;
    s.seed = seed;
    o.seq_id = 2;
    o.prompt = other;
    o.seed = 99;
    if (batched) {
      Generate(ex, {&o, &s}, 40, 3, p);
    } else {
      Generate(ex, {&s}, 40, 3, p);
    }
    return s.tokens;
  };
  const auto a = run(5, false);
  EXPECT_EQ(a, run(5, false));
  EXPECT_EQ(a, run(5, true));
  EXPECT_NE(a, run(6, false));
  EXPECT_GT(drafts_, 30);
}

}  // namespace
}  // namespace dsmesh

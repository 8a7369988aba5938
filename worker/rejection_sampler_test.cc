// The rejection sampler is unbiased: on synthetic target distributions p and draft distributions q (equal,
// strongly different, disjoint supports, one-hot greedy drafts), a draft drawn from q and verified by
// VerifyDraft yields tokens distributed as p (chi-square goodness of fit), and drafts are accepted with
// probability sum_t min(p(t), q(t)).
//
// Error rates: the draws come from the fixed (seed, position) streams, so each run gives the same result.
// Over seeds, a correct sampler fails one chi-square check with probability 1e-4 (the critical values are
// the 1 - 1e-4 quantiles) and one acceptance-rate check with probability < 1e-5 (|z| < 4.5); with the 8
// cases x 2 checks here a seed would fail with probability < 1e-3. A sampler that draws the recovery token
// from p instead of the residual, or accepts with probability p(d), fails the strongly different cases by
// chi-square values in the hundreds or more.
#include "worker/rejection_sampler.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/sampling/random_stream.h"

namespace dsmesh {
namespace {

// Upper 1e-4 quantiles of the chi-square distribution, degrees of freedom 1..10.
double ChiSquareCritical(int df) {
  static const double q[] = {0, 15.137, 18.421, 21.108, 23.513, 25.745, 27.856, 29.878, 31.828, 33.720, 35.564};
  return q[df];
}

SamplingParams Params(float temperature, int top_k = 0, float top_p = 1) {
  SamplingParams p;
  p.set_temperature(temperature);
  p.set_top_k(top_k);
  p.set_top_p(top_p);
  return p;
}

TokenDist Dist(const std::vector<float>& logits, const SamplingParams& params) {
  return ProcessedDist(logits.data(), static_cast<int64_t>(logits.size()), params, {});
}

std::vector<double> Dense(const TokenDist& d, size_t vocab) {
  std::vector<double> out(vocab, 0.0);
  for (size_t i = 0; i < d.ids.size(); ++i) out[d.ids[i]] = d.prob(i);
  return out;
}

struct Outcome {
  double chi2 = 0;
  int df = 0;
  double accept_z = 0;
};

// n trials: draft d ~ q (or the fixed greedy draft), VerifyDraft, count the tokens.
Outcome Run(const TokenDist& p, const TokenDist* q, int32_t greedy_draft, size_t vocab, uint64_t seed, int n) {
  std::vector<int> count(vocab, 0);
  int accepted = 0;
  for (int t = 0; t < n; ++t) {
    const int32_t d = q ? DrawToken(*q, Uniform01(seed, t, RandomStream::kDraft)) : greedy_draft;
    const DraftVerdict v = VerifyDraft(p, d, q, seed, t);
    EXPECT_TRUE(!v.accepted || v.token_id == d);
    ++count.at(v.token_id);
    accepted += v.accepted;
  }
  const std::vector<double> pd = Dense(p, vocab);
  Outcome o;
  for (size_t i = 0; i < vocab; ++i) {
    if (pd[i] == 0) {
      EXPECT_EQ(count[i], 0) << "token " << i << " has p = 0";
      continue;
    }
    const double e = n * pd[i];
    o.chi2 += (count[i] - e) * (count[i] - e) / e;
    ++o.df;
  }
  --o.df;
  double a = 0;  // P(accept) = sum_t min(p(t), q(t))
  if (q) {
    const std::vector<double> qd = Dense(*q, vocab);
    for (size_t i = 0; i < vocab; ++i) a += std::min(pd[i], qd[i]);
  } else {
    a = pd[greedy_draft];
  }
  const double sd = std::sqrt(n * a * (1 - a));
  // a = 0 or 1 (up to rounding): the count is certain.
  o.accept_z = sd > 1e-3 ? (accepted - n * a) / sd : (std::abs(accepted - n * a) < 0.5 ? 0 : 1e9);
  return o;
}

void ExpectUnbiased(const std::string& name, const TokenDist& p, const TokenDist* q, int32_t greedy_draft,
                    size_t vocab, uint64_t seed) {
  const Outcome o = Run(p, q, greedy_draft, vocab, seed, 40000);
  if (o.df > 0) EXPECT_LT(o.chi2, ChiSquareCritical(o.df)) << name << ": chi-square " << o.chi2 << " df " << o.df;
  EXPECT_LT(std::abs(o.accept_z), 4.5) << name << ": acceptance z " << o.accept_z;
}

const std::vector<float> kTarget = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -2.0f};
const std::vector<float> kReversed = {-2.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f, 2.0f};

TEST(RejectionSampler, EqualDistributionsAlwaysAccept) {
  const TokenDist p = Dist(kTarget, Params(1));
  for (int t = 0; t < 1000; ++t) {
    const int32_t d = DrawToken(p, Uniform01(3, t, RandomStream::kDraft));
    EXPECT_TRUE(VerifyDraft(p, d, &p, 3, t).accepted);
  }
  ExpectUnbiased("q = p", p, &p, -1, 8, 11);
}

TEST(RejectionSampler, StronglyDifferentDraftsStillGiveTheTarget) {
  const TokenDist p = Dist(kTarget, Params(1));
  const TokenDist rev = Dist(kReversed, Params(1));
  ExpectUnbiased("q reversed", p, &rev, -1, 8, 12);
  const TokenDist sharp = Dist(kReversed, Params(0.25f));  // nearly all mass on p's least likely token
  ExpectUnbiased("q sharp on p's tail", p, &sharp, -1, 8, 13);
  const TokenDist flat = Dist(kTarget, Params(10));
  ExpectUnbiased("q flat", p, &flat, -1, 8, 14);
}

TEST(RejectionSampler, SupportsThatDifferUnderTopKAndTopP) {
  // p keeps 3 tokens (top_k), q keeps p's tail (top_p of the reversed logits): drafts outside p's support
  // are always rejected, and p's tokens q lacks come only from recovery.
  const TokenDist p = Dist(kTarget, Params(1, 3));
  const TokenDist q = Dist(kReversed, Params(0.7f, 0, 0.9f));
  ASSERT_EQ(p.ids.size(), 3u);
  ExpectUnbiased("top_k p, top_p q", p, &q, -1, 8, 15);
  const TokenDist q2 = Dist(kTarget, Params(1.5f, 5));
  ExpectUnbiased("top_k p, wider q", Dist(kTarget, Params(0.8f, 0, 0.8f)), &q2, -1, 8, 16);
}

TEST(RejectionSampler, GreedyDraftsAreOneHotQ) {
  const TokenDist p = Dist(kTarget, Params(1));
  ExpectUnbiased("greedy draft = p's mode", p, nullptr, 0, 8, 17);
  ExpectUnbiased("greedy draft = p's tail", p, nullptr, 7, 8, 18);
  // A draft p cannot produce is rejected, and the recovery token is drawn from p.
  const TokenDist pk = Dist(kTarget, Params(1, 2));
  for (int t = 0; t < 200; ++t) EXPECT_FALSE(VerifyDraft(pk, 5, nullptr, 1, t).accepted);
}

TEST(RejectionSampler, GreedyTargetAcceptsOnlyTheArgmax) {
  const TokenDist p = Dist(kTarget, Params(0));
  ASSERT_EQ(p.ids, std::vector<int32_t>{0});
  for (int t = 0; t < 100; ++t) {
    EXPECT_TRUE(VerifyDraft(p, 0, nullptr, 5, t).accepted);
    const DraftVerdict v = VerifyDraft(p, 3, nullptr, 5, t);
    EXPECT_FALSE(v.accepted);
    EXPECT_EQ(v.token_id, 0);
  }
}

TEST(RejectionSampler, SameSeedAndPositionSameVerdict) {
  const TokenDist p = Dist(kTarget, Params(1));
  const TokenDist q = Dist(kReversed, Params(1));
  int differ = 0;
  for (int t = 0; t < 500; ++t) {
    const DraftVerdict a = VerifyDraft(p, 6, &q, 77, t), b = VerifyDraft(p, 6, &q, 77, t);
    EXPECT_EQ(a.accepted, b.accepted);
    EXPECT_EQ(a.token_id, b.token_id);
    differ += a.token_id != VerifyDraft(p, 6, &q, 78, t).token_id;
  }
  EXPECT_GT(differ, 50);  // another seed draws other tokens
}

}  // namespace
}  // namespace dsmesh

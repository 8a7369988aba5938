#include "worker/rejection_sampler.h"

#include <algorithm>
#include <unordered_map>

#include "kernels/sampling/random_stream.h"

namespace dsmesh {
namespace {

double ProbOf(const TokenDist& d, int32_t token) {
  for (size_t i = 0; i < d.ids.size(); ++i)
    if (d.ids[i] == token) return d.prob(i);
  return 0.0;
}

}  // namespace

DraftVerdict VerifyDraft(const TokenDist& p, int32_t draft, const TokenDist* q, uint64_t seed, int64_t position) {
  DraftVerdict v;
  const double pd = ProbOf(p, draft);
  const double qd = q ? ProbOf(*q, draft) : 1.0;
  // Accept when u * q(d) < p(d), u uniform in [0, 1): probability min(1, p(d) / q(d)). A draft outside q's
  // support (q(d) = 0) is rejected, as vLLM does.
  if (qd > 0 && pd > 0 && Uniform01(seed, position, RandomStream::kAccept) * qd < pd) {
    v.accepted = true;
    v.token_id = draft;
    return v;
  }
  // Recovery: residual weights max(p - q, 0) over p's support (outside it p = 0, so the residual is 0),
  // in p's order, drawn by the kRecover uniform.
  std::unordered_map<int32_t, double> qmap;
  if (q)
    for (size_t i = 0; i < q->ids.size(); ++i) qmap.emplace(q->ids[i], q->prob(i));
  TokenDist r;
  r.ids = p.ids;
  r.weights.resize(p.ids.size());
  for (size_t i = 0; i < p.ids.size(); ++i) {
    double qi = 0;
    if (q) {
      auto it = qmap.find(p.ids[i]);
      if (it != qmap.end()) qi = it->second;
    } else if (p.ids[i] == draft) {
      qi = 1.0;
    }
    r.total += r.weights[i] = std::max(p.prob(i) - qi, 0.0);
  }
  // p == q up to rounding leaves no residual; rejection then had probability ~0: draw from p.
  const double u = Uniform01(seed, position, RandomStream::kRecover);
  v.token_id = r.total > 0 ? DrawToken(r, u) : DrawToken(p, u);
  return v;
}

}  // namespace dsmesh

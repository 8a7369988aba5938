// The MTP block (dsv4-model.md section 5.1; DeepSeek's reference MTPBlock) and greedy drafting (5.2),
// written against the Backend interface like the main forward. The block's row for position t is
// (X_t, token t+1): X0 = h_proj(hnorm(X_t)) on each residual stream + e_proj(enorm(embed(token t+1))) on
// every stream (the embedding row is zeroed at position 0, as vLLM does), then one sliding-window block
// with its own window ring and MoE, then its own hc head and norm and the shared lm_head. Each draft is
// the argmax of its logits or what the request's `choose` picks (sampled drafts).
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

#include "kernels/cpu/argmax.h"
#include "model/model_impl.h"

namespace dsmesh {

Tensor ModelImpl::MtpInput(const MtpWeights& m, const Tensor& X, const std::vector<int32_t>& tokens,
                           const std::vector<int64_t>& positions) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size, N = X.shape[0];
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor e = be.Alloc(DType::kF32, {N, D});
  be.Embedding(weights_.embed, tokens.data(), N, &e);
  for (int64_t r = 0; r < N; ++r)
    if (positions[r] == 0) {
      Tensor row = RowView(e, r, 1);
      be.Scale(&row, 0.0f);
    }
  be.RmsNorm(e, D, &m.enorm, eps, &e);
  Tensor ep = be.Alloc(DType::kF32, {N, D});
  be.Linear(e, m.e_proj, &ep);

  Tensor hs = be.Alloc(DType::kF32, {N * hc, D});  // one row per (token, stream)
  Tensor hs_rows = hs;
  hs_rows.shape = {N, hc * D};
  be.CopyRows(X, 0, &hs_rows, 0, N);
  be.RmsNorm(hs, D, &m.hnorm, eps, &hs);
  Tensor hp = be.Alloc(DType::kF32, {N * hc, D});
  be.Linear(hs, m.h_proj, &hp);
  hp.shape = {N, hc * D};
  Tensor eb = be.Alloc(DType::kF32, {N, hc * D});
  be.HcExpand(ep, hc, &eb);
  be.Add(eb, &hp);
  return hp;
}

std::vector<DraftResult> ModelImpl::Draft(const std::vector<DraftRequest>& batch) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const int window = c.sliding_window;
  if (weights_.mtp.empty()) throw std::runtime_error("Draft: the model has no MTP block");
  const MtpWeights& m = weights_.mtp[0];

  std::set<const SequenceState*> seen;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftRequest& q = batch[i];
    const std::string where = "Draft: batch entry " + std::to_string(i);
    if (!q.state || q.state->data().owner_model != this) throw std::runtime_error(where + " has no state of this model");
    if (!seen.insert(q.state).second) throw std::runtime_error(where + " repeats a state");
    if (!q.state->data().mtp.enabled()) throw std::runtime_error(where + ": the state was made without speculation");
    if (q.next_token >= V) throw std::runtime_error(where + ": token id " + std::to_string(q.next_token) + " is outside the vocabulary");
    if (q.num_drafts < 0 || q.num_drafts > q.state->data().spare + 1 || (q.num_drafts > 0 && q.next_token < 0))
      throw std::runtime_error(where + ": " + std::to_string(q.num_drafts) + " drafts not possible here");
  }

  // Step 1: every sequence's catch-up rows t0 .. last in one batch; `last` is the row drafts chain from.
  std::vector<SeqRows> seqs;
  std::vector<int64_t> positions, last_row(batch.size(), -1);
  std::vector<int32_t> tokens;
  Tensor Xin;
  {
    std::vector<std::pair<size_t, int64_t>> gather;  // (batch entry, first position)
    for (size_t i = 0; i < batch.size(); ++i) {
      SequenceStateData& st = batch[i].state->data();
      const int64_t L = st.length, last = batch[i].next_token >= 0 ? L - 1 : L - 2;
      if (last < 0) continue;
      // Only the window of the last row matters (the block attends through its window only); a row
      // already consumed is recomputed when it is the last one (same inputs, same ring row).
      const int64_t t0 = std::min(std::max(st.mtp.length, last + 1 - window), last);
      if (t0 > last || (st.mtp.length > last && batch[i].num_drafts == 0)) continue;
      seqs.push_back({&st, (int64_t)positions.size(), last - t0 + 1, t0});
      gather.push_back({i, t0});
      const int64_t slots = st.mtp.hidden.shape[0];
      for (int64_t t = t0; t <= last; ++t) {
        positions.push_back(t);
        tokens.push_back(t + 1 == L ? batch[i].next_token : st.mtp.tokens[(t + 1) % slots]);
      }
      last_row[i] = (int64_t)positions.size() - 1;
    }
    if (seqs.empty()) return std::vector<DraftResult>(batch.size());
    Tensor X = be.Alloc(DType::kF32, {(int64_t)positions.size(), hc * D});
    for (size_t k = 0; k < seqs.size(); ++k)
      RingGet(be, seqs[k].state->mtp.hidden, seqs[k].start, seqs[k].count, &X, seqs[k].offset);
    Xin = MtpInput(m, X, tokens, positions);
  }
  RunBlock(m.block, seqs, positions, tokens, &Xin);
  for (const SeqRows& s : seqs) s.state->mtp.length = s.start + s.count;

  // Draft rows: the last row of every sequence that wants drafts, then one chained row per further draft.
  std::vector<DraftResult> out(batch.size());
  std::vector<size_t> active;
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i].num_drafts > 0) {
      active.push_back(i);
      out[i].logits = AllocateTensor(DType::kF32, {batch[i].num_drafts, V});
    }
  Tensor state = be.Alloc(DType::kF32, {(int64_t)active.size(), hc * D});  // MTP output rows to chain from
  for (size_t a = 0; a < active.size(); ++a) be.CopyRows(Xin, last_row[active[a]], &state, a, 1);
  for (int step = 0; !active.empty(); ++step) {
    Tensor logits = HeadLogits(state, m.hc_head, m.norm, /*step_rows=*/0);
    std::vector<size_t> next;
    std::vector<int64_t> keep;
    for (size_t a = 0; a < active.size(); ++a) {
      const size_t i = active[a];
      const float* row = logits.as<float>() + a * V;
      std::copy(row, row + V, out[i].logits.as<float>() + step * V);
      out[i].tokens.push_back(batch[i].choose ? batch[i].choose(step, row) : Argmax(row, V));
      if ((int)out[i].tokens.size() < batch[i].num_drafts) {
        next.push_back(i);
        keep.push_back((int64_t)a);
      }
    }
    if (next.empty()) break;
    // Draft step+2 from (the block's output for the previous row, the draft just made) one position on.
    std::vector<SeqRows> cs;
    std::vector<int64_t> pos;
    std::vector<int32_t> tok;
    Tensor prev = be.Alloc(DType::kF32, {(int64_t)next.size(), hc * D});
    for (size_t k = 0; k < next.size(); ++k) {
      SequenceStateData& st = batch[next[k]].state->data();
      const int64_t p = st.length + step;
      cs.push_back({&st, (int64_t)k, 1, p});
      pos.push_back(p);
      tok.push_back(out[next[k]].tokens.back());
      be.CopyRows(state, keep[k], &prev, (int64_t)k, 1);
    }
    Tensor x = MtpInput(m, prev, tok, pos);
    RunBlock(m.block, cs, pos, tok, &x);  // writes ring rows past mtp.length: forgotten, within the spare slots
    state = x;
    active = next;
  }
  return out;
}

}  // namespace dsmesh

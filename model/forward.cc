// The DeepSeek-V4 forward pass (dsv4-model.md section 2), written once against the Backend interface.
// One step runs every sequence of the batch together through the per-token work (projections, norms,
// hyper-connections, MoE) and one sequence at a time through the stateful work (compressors, indexer,
// attention against the sequence's own window and entries).
#include <cmath>
#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/model_impl.h"

namespace dsmesh {

void ModelImpl::Validate(const std::vector<SequenceStep>& batch) const {
  if (batch.empty()) throw std::runtime_error("Forward: empty batch");
  std::set<const SequenceState*> seen;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceStep& step = batch[s];
    std::string where = "Forward: batch entry " + std::to_string(s);
    if (!step.state) throw std::runtime_error(where + " has no state");
    if (!seen.insert(step.state).second) throw std::runtime_error(where + " repeats a state already in the batch");
    if (step.state->data().owner_model != this)
      throw std::runtime_error(where + ": the state was created by another model");
    if (step.tokens.empty()) throw std::runtime_error(where + " has no tokens");
    for (int32_t t : step.tokens)
      if (t < 0 || t >= config_.vocab_size)
        throw std::runtime_error(where + ": token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                 std::to_string(config_.vocab_size) + ")");
  }
}

void ModelImpl::AllReduce(Tensor* t) {
  if (comm_->world() == 1) return;
  if (backend_->host_memory() == !comm_->device_buffers()) {
    comm_->AllReduceSum(static_cast<float*>(t->data), static_cast<size_t>(t->numel()));
    return;
  }
  // Device tensors with a host communicator (Gloo; several ranks sharing one GPU): stage through the host.
  std::vector<float> host(static_cast<size_t>(t->numel()));
  backend_->ToHost(*t, host.data());
  comm_->AllReduceSum(host.data(), host.size());
  backend_->FromHost(host.data(), t);
}

void ModelImpl::RunCompressor(const CompressorWeights& w, const Tensor& x, int layer, bool indexer,
                              const std::vector<SeqRows>& seqs) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int64_t N = x.shape[0];
  const CompressorState& proto = indexer ? seqs[0].state->layers[layer].indexer : seqs[0].state->layers[layer].compressor;
  const int ratio = proto.ratio;
  const bool overlap = proto.overlap;
  const int64_t dim = proto.dim, width = proto.width();
  Tensor kvp = be.Alloc(DType::kF32, {N, width});
  Tensor score = be.Alloc(DType::kF32, {N, width});
  be.Linear(x, w.wkv, &kvp);
  be.Linear(x, w.wgate, &score);
  for (const SeqRows& s : seqs) {
    CompressorState& cs = indexer ? s.state->layers[layer].indexer : s.state->layers[layer].compressor;
    Tensor sc = RowView(score, s.offset, s.count);
    be.AddPositionBias(&sc, w.ape, s.start, ratio);
    const int64_t end = s.start + s.count;
    const int64_t emitted = cs.num_entries, emitted_after = end / ratio;
    if (emitted_after > emitted) {
      // Rows for positions base .. end-1: the pending ones from the ring, then this step's.
      const int64_t base = cs.PendingBase(emitted), old = s.start - base;
      Tensor all_kv = be.Alloc(DType::kF32, {old + s.count, width});
      Tensor all_sc = be.Alloc(DType::kF32, {old + s.count, width});
      RingGet(be, cs.pending_kv, base, old, &all_kv, 0);
      RingGet(be, cs.pending_score, base, old, &all_sc, 0);
      be.CopyRows(kvp, s.offset, &all_kv, old, s.count);
      be.CopyRows(score, s.offset, &all_sc, old, s.count);
      const int64_t fresh = emitted_after - emitted;
      Tensor entries = be.Alloc(DType::kF32, {fresh, dim});
      be.CompressorPool(all_kv, all_sc, base, emitted, fresh, ratio, overlap, dim, &entries);
      be.RmsNorm(entries, dim, &w.norm, static_cast<float>(c.rms_norm_eps), &entries);
      std::vector<int64_t> pos(fresh);
      for (int64_t i = 0; i < fresh; ++i) pos[i] = (emitted + i) * ratio;  // a window's first position
      be.Rope(&entries, 1, dim, c.rope_dim, pos.data(), inv_freq_[layer], false);
      s.state->EnsureEntries(&cs, emitted_after);
      be.CopyRows(entries, 0, &cs.entries, emitted, fresh);
      cs.num_entries = emitted_after;
    }
    // The ring keeps this step's newest rows; older pending rows stay in their slots until overwritten.
    const int64_t from = std::max(s.start, end - cs.slots());
    RingPut(be, kvp, s.offset + (from - s.start), from, end - from, &cs.pending_kv);
    RingPut(be, score, s.offset + (from - s.start), from, end - from, &cs.pending_score);
  }
}

void ModelImpl::AttentionBlock(const BlockWeights& b, const Tensor& x, const std::vector<SeqRows>& seqs,
                               const std::vector<int64_t>& positions, Tensor* out) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const AttentionWeights& a = b.attn;
  const int64_t N = x.shape[0], d = c.head_dim, Hl = layout_.local_heads;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const std::vector<float>& inv = inv_freq_[b.layer];

  Tensor qr = be.Alloc(DType::kF32, {N, c.q_lora_rank});
  be.Linear(x, a.wq_a, &qr);
  be.RmsNorm(qr, c.q_lora_rank, &a.q_norm, eps, &qr);
  Tensor q = be.Alloc(DType::kF32, {N, Hl * d});
  be.Linear(qr, a.wq_b, &q);
  be.RmsNorm(q, d, nullptr, eps, &q);  // per-head, weightless
  be.Rope(&q, Hl, d, c.rope_dim, positions.data(), inv, false);

  Tensor kv = be.Alloc(DType::kF32, {N, d});
  be.Linear(x, a.wkv, &kv);
  be.RmsNorm(kv, d, &a.kv_norm, eps, &kv);
  be.Rope(&kv, 1, d, c.rope_dim, positions.data(), inv, false);

  // Compressed entries first: a query may use every window completed up to and including itself.
  if (b.kind != AttentionKind::kSliding) RunCompressor(a.compressor, x, b.layer, false, seqs);

  Tensor topk;
  if (b.kind == AttentionKind::kCompressedSparse) {
    RunCompressor(a.indexer_compressor, x, b.layer, true, seqs);
    const int64_t hi = c.index_n_heads, di = c.index_head_dim;
    Tensor iq = be.Alloc(DType::kF32, {N, hi * di});
    be.Linear(qr, a.indexer_wq_b, &iq);
    be.Rope(&iq, hi, di, c.rope_dim, positions.data(), inv, false);
    Tensor iw = be.Alloc(DType::kF32, {N, hi});
    be.Linear(x, a.indexer_weights_proj, &iw);
    be.Scale(&iw, static_cast<float>(1.0 / std::sqrt(static_cast<double>(di)) / std::sqrt(static_cast<double>(hi))));
    topk = be.Alloc(DType::kI32, {N, c.index_topk});
    for (const SeqRows& s : seqs) {
      const CompressorState& ic = s.state->layers[b.layer].indexer;
      Tensor tv = RowView(topk, s.offset, s.count);
      be.IndexerTopK(RowView(iq, s.offset, s.count), RowView(iw, s.offset, s.count), ic.entries, ic.num_entries, hi,
                     di, positions.data() + s.offset, b.ratio, c.index_topk, &tv);
    }
  }

  Tensor o = be.Alloc(DType::kF32, {N, Hl * d});
  const float softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (const SeqRows& s : seqs) {
    LayerState& ls = s.state->layers[b.layer];
    Tensor ov = RowView(o, s.offset, s.count);
    Tensor kvv = RowView(kv, s.offset, s.count);
    Tensor tv;
    if (topk.data) tv = RowView(topk, s.offset, s.count);
    const bool compressed = b.kind != AttentionKind::kSliding;
    be.Attention(RowView(q, s.offset, s.count), Hl, d, s.start, ls.ring, kvv, c.sliding_window,
                 compressed ? &ls.compressor.entries : nullptr, compressed ? ls.compressor.num_entries : 0,
                 b.ratio, topk.data ? &tv : nullptr, a.sinks, softmax_scale, &ov);
    be.UpdateRing(kvv, s.start, c.sliding_window, &ls.ring);
  }
  be.Rope(&o, Hl, d, c.rope_dim, positions.data(), inv, true);  // undo the rope the values carried

  Tensor oa = be.Alloc(DType::kF32, {N, (int64_t)layout_.local_groups * c.o_lora_rank});
  be.GroupedLinear(o, a.wo_a, layout_.local_groups, &oa);
  be.Linear(oa, a.wo_b, out);
}

void ModelImpl::MoeBlock(const BlockWeights& b, const Tensor& x, const std::vector<int32_t>& tokens, Tensor* out) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const MoeWeights& m = b.moe;
  const int64_t N = x.shape[0];
  Tensor logits = be.Alloc(DType::kF32, {N, (int64_t)c.n_routed_experts});
  be.Linear(x, m.gate, &logits);
  RouterParams p;
  p.top_k = c.num_experts_per_tok;
  p.normalize = c.norm_topk_prob;
  p.routed_scale = static_cast<float>(c.routed_scaling_factor);
  p.hash = c.mlp_kind(b.layer) == MlpKind::kHashMoe;
  p.bias = p.hash ? nullptr : &m.bias;
  p.tid2eid = p.hash ? &m.tid2eid : nullptr;
  Tensor idx = be.Alloc(DType::kI32, {N, (int64_t)p.top_k});
  Tensor wt = be.Alloc(DType::kF32, {N, (int64_t)p.top_k});
  be.MoeRoute(logits, tokens.data(), p, &idx, &wt);
  const float limit = static_cast<float>(c.swiglu_limit);
  be.MoeExperts(x, idx, wt, m.experts, limit, out);
  if (m.has_shared) be.SharedExpert(x, m.shared, limit, out);
}

void ModelImpl::RunBlock(const BlockWeights& b, const std::vector<SeqRows>& seqs,
                         const std::vector<int64_t>& positions, const std::vector<int32_t>& tokens, Tensor* X) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size, N = X->shape[0];
  const float eps = static_cast<float>(c.rms_norm_eps), hc_eps = static_cast<float>(c.hc_eps);
  Tensor X2 = be.Alloc(DType::kF32, {N, hc * D});
  Tensor y = be.Alloc(DType::kF32, {N, D});
  Tensor post = be.Alloc(DType::kF32, {N, (int64_t)hc});
  Tensor comb = be.Alloc(DType::kF32, {N, (int64_t)hc * hc});
  Tensor f = be.Alloc(DType::kF32, {N, D});

  be.HcPre(*X, b.hc_attn.fn, b.hc_attn.base, b.hc_attn.scale, hc, c.hc_sinkhorn_iters, hc_eps, eps, &y, &post, &comb);
  be.RmsNorm(y, D, &b.attn_norm, eps, &y);
  AttentionBlock(b, y, seqs, positions, &f);
  AllReduce(&f);
  be.HcPost(*X, f, post, comb, hc, &X2);

  be.HcPre(X2, b.hc_ffn.fn, b.hc_ffn.base, b.hc_ffn.scale, hc, c.hc_sinkhorn_iters, hc_eps, eps, &y, &post, &comb);
  be.RmsNorm(y, D, &b.ffn_norm, eps, &y);
  f = be.Alloc(DType::kF32, {N, D});  // the MoE accumulates into a zeroed buffer
  MoeBlock(b, y, tokens, &f);
  AllReduce(&f);
  be.HcPost(X2, f, post, comb, hc, X);
}

Tensor ModelImpl::HeadLogits(const Tensor& Xs, const HcWeights& hc_head, const Tensor& norm) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int64_t D = c.hidden_size, R = Xs.shape[0];
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor z = be.Alloc(DType::kF32, {R, D});
  be.HcHead(Xs, hc_head.fn, hc_head.base, hc_head.scale, c.hc_mult, static_cast<float>(c.hc_eps), eps, &z);
  be.RmsNorm(z, D, &norm, eps, &z);
  const int64_t V = c.vocab_size, per = weights_.head_rows_per_rank, Vl = weights_.head.out;
  Tensor lv = be.Alloc(DType::kF32, {R, Vl});
  be.Linear(z, weights_.head, &lv);
  Tensor out = AllocateTensor(DType::kF32, {R, V});
  float* dst = out.as<float>();
  const int world = comm_->world();
  if (world == 1) {
    be.ToHost(lv, dst);
    return out;
  }
  // Each rank holds `per` vocabulary rows (the last rank possibly fewer); gather them as padded blocks.
  std::vector<float> mine(R * per, 0.0f), local(R * Vl), all(static_cast<size_t>(world) * R * per);
  be.ToHost(lv, local.data());
  for (int64_t r = 0; r < R; ++r) std::memcpy(&mine[r * per], &local[r * Vl], Vl * sizeof(float));
  comm_->AllGather(mine.data(), mine.size(), all.data());
  for (int64_t r = 0; r < R; ++r)
    for (int rank = 0; rank < world; ++rank) {
      int64_t v0 = rank * per, v1 = std::min<int64_t>(V, v0 + per);
      if (v1 <= v0) continue;
      std::memcpy(dst + r * V + v0, &all[(static_cast<size_t>(rank) * R + r) * per], (v1 - v0) * sizeof(float));
    }
  return out;
}

void ModelImpl::RecordMtpInput(const Tensor& X, const std::vector<SeqRows>& seqs, const std::vector<int32_t>& tokens) {
  for (const SeqRows& s : seqs) {
    MtpState& m = s.state->mtp;
    if (!m.enabled()) continue;
    const int64_t slots = m.hidden.shape[0], end = s.start + s.count;
    const int64_t from = std::max(s.start, end - slots);
    RingPut(*backend_, X, s.offset + (from - s.start), from, end - from, &m.hidden);
    for (int64_t p = from; p < end; ++p) m.tokens[p % slots] = tokens[s.offset + (p - s.start)];
  }
}

std::vector<SequenceOutput> ModelImpl::Forward(const std::vector<SequenceStep>& batch) {
  Validate(batch);
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size;

  std::vector<SeqRows> seqs;
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  for (const SequenceStep& step : batch) {
    SequenceStateData* st = &step.state->data();
    seqs.push_back({st, (int64_t)tokens.size(), (int64_t)step.tokens.size(), st->length});
    for (size_t i = 0; i < step.tokens.size(); ++i) {
      tokens.push_back(step.tokens[i]);
      positions.push_back(st->length + (int64_t)i);
    }
  }
  const int64_t N = tokens.size();

  Tensor X = be.Alloc(DType::kF32, {N, hc * D});
  {
    Tensor h = be.Alloc(DType::kF32, {N, D});
    be.Embedding(weights_.embed, tokens.data(), N, &h);
    be.HcExpand(h, hc, &X);
  }
  for (const BlockWeights& b : weights_.layers) RunBlock(b, seqs, positions, tokens, &X);
  for (const SeqRows& s : seqs) s.state->length += s.count;
  RecordMtpInput(X, seqs, tokens);

  // Rows that need logits.
  std::vector<int64_t> rows;
  std::vector<int64_t> first_row(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    first_row[i] = rows.size();
    if (batch[i].all_logits) {
      for (int64_t r = 0; r < seqs[i].count; ++r) rows.push_back(seqs[i].offset + r);
    } else {
      rows.push_back(seqs[i].offset + seqs[i].count - 1);
    }
  }
  const int64_t R = rows.size();
  Tensor Xs = be.Alloc(DType::kF32, {R, hc * D});
  for (int64_t r = 0; r < R; ++r) be.CopyRows(X, rows[r], &Xs, r, 1);
  Tensor logits = HeadLogits(Xs, weights_.hc_head, weights_.norm);
  const int64_t V = c.vocab_size;

  std::vector<SequenceOutput> outs(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    int64_t n = batch[i].all_logits ? seqs[i].count : 1;
    Tensor lg = AllocateTensor(DType::kF32, {n, V});
    std::memcpy(lg.as<float>(), logits.as<float>() + first_row[i] * V, static_cast<size_t>(n * V) * sizeof(float));
    outs[i].logits = lg;
    if (batch[i].want_hidden) {
      Tensor hid = AllocateTensor(DType::kF32, {n, hc * D});
      be.ToHost(RowView(Xs, first_row[i], n), hid.as<float>());
      outs[i].hidden = hid;
    }
  }
  return outs;
}

}  // namespace dsmesh

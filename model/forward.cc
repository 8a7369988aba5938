// The DeepSeek-V4 forward pass (docs/model-v4.md section 2), written once against the Backend interface.
// One step runs every sequence of the batch together through the per-token work (projections, norms,
// hyper-connections, MoE) and one sequence at a time through the stateful work (compressors, indexer,
// attention against the sequence's own window and entries).
#include <cmath>
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/model_impl.h"

namespace dsmesh {
namespace {

// Runs `ops` as the graph segment `key`, or directly in a step with image rows: where the image rows lie
// changes the launches (embeddings placed over rows, bias_vl routing), and the key holds only shapes, so a
// record of a text step of the same shapes must not replay for it.
void SegmentUnlessImages(Backend& be, const Backend::SegmentKey& key, bool images, const std::function<void()>& ops) {
  if (images) {
    ops();
  } else {
    be.Segment(key, ops);
  }
}

}  // namespace

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
    if (!step.images.empty()) ValidateImages(step, where);
  }
}

// Image rows are refused before anything moves, so that a refused step leaves every state as it was.
void ModelImpl::ValidateImages(const SequenceStep& step, const std::string& where) const {
  const StepImageRows& im = step.images;
  if (!backend_->supports_image_rows())
    throw std::runtime_error(where + ": image rows are not implemented on " + backend_->name());
  if (!config_.vision.enabled())
    throw std::runtime_error(where + " has image rows but the model has no vision tower (vision_n_layers 0)");
  const int64_t n = static_cast<int64_t>(step.tokens.size()), k = static_cast<int64_t>(im.rows.size());
  for (int64_t i = 0; i < k; ++i)
    if (im.rows[i] < 0 || im.rows[i] >= n || (i > 0 && im.rows[i] <= im.rows[i - 1]))
      throw std::runtime_error(where + ": image rows must be ascending token indices in [0, " + std::to_string(n) + ")");
  const Tensor& e = im.embeddings;
  if (e.dtype != DType::kF32 || e.shape.size() != 2 || e.shape[0] != k || e.shape[1] != config_.hidden_size ||
      !e.data)
    throw std::runtime_error(where + ": image embeddings must be host f32 [" + std::to_string(k) + ", " +
                             std::to_string(config_.hidden_size) + "], got " + DTypeName(e.dtype) + " " +
                             e.ShapeString());
  std::vector<uint8_t> is_image(n, 0);
  for (int64_t r : im.rows) is_image[r] = 1;
  int64_t after = 0;  // the first token index a next span may start at
  for (const StepImageRows::Span& sp : im.spans) {
    if (sp.first < after || sp.last < sp.first || sp.last >= n)
      throw std::runtime_error(where + ": image spans must be ascending, disjoint and inside the step's " +
                               std::to_string(n) + " tokens (an image is prefilled in one step)");
    if (sp.last - sp.first + 1 > config_.vision.max_n_token)
      throw std::runtime_error(where + ": an image span of " + std::to_string(sp.last - sp.first + 1) +
                               " rows is longer than vision_max_n_token " + std::to_string(config_.vision.max_n_token));
    for (int64_t r = sp.first; r <= sp.last; ++r)
      if (!is_image[r]) throw std::runtime_error(where + ": image span row " + std::to_string(r) + " is not an image row");
    after = sp.last + 1;
  }
  if (!weights_.layers.empty() && !weights_.layers[0].moe.bias_vl.data)
    throw std::runtime_error(where + " has image rows but the weights carry no ffn.gate.bias_vl");
}

void ModelImpl::PlaceImageEmbeddings(const std::vector<SeqRows>& seqs, Tensor* h) {
  Backend& be = *backend_;
  // The given rows' scratch is released here, so that the step's later temporaries lie where a text
  // step's do (graph segments recorded by text steps replay only at the offsets they were recorded at).
  const size_t mark = be.ScratchMark();
  for (const SeqRows& s : seqs) {
    if (!s.images || s.images->empty()) continue;
    const StepImageRows& im = *s.images;
    Tensor given = be.Scratch(DType::kF32, {static_cast<int64_t>(im.rows.size()), config_.hidden_size});
    be.FromHost(im.embeddings.data, &given);
    // One copy per run of consecutive rows (an image block is one run).
    for (size_t i = 0; i < im.rows.size();) {
      size_t j = i + 1;
      while (j < im.rows.size() && im.rows[j] == im.rows[j - 1] + 1) ++j;
      be.CopyRows(given, static_cast<int64_t>(i), h, s.offset + im.rows[i], static_cast<int64_t>(j - i));
      i = j;
    }
  }
  be.ReleaseScratch(mark);
}

void ModelImpl::AllReduce(Tensor* t) {
  if (comm_->world() == 1) return;
  Phase phase(*backend_, "collectives");
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


ModelImpl::BlockActivations ModelImpl::AllocateBlockActivations(const BlockWeights& b, const SeqRows& first,
                                                                 int64_t N) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int64_t D = c.hidden_size, hc = c.hc_mult, d = c.head_dim, Hl = layout_.local_heads;
  BlockActivations a;
  a.y = be.Scratch(DType::kF32, {N, D});
  a.post = be.Scratch(DType::kF32, {N, hc});
  a.comb = be.Scratch(DType::kF32, {N, hc * hc});
  a.X2 = be.Scratch(DType::kF32, {N, hc * D});
  a.attn_out = be.Scratch(DType::kF32, {N, D});
  a.moe_out = be.Scratch(DType::kF32, {N, D});
  a.qr = be.Scratch(DType::kF32, {N, c.q_lora_rank});
  a.q = be.Scratch(DType::kF32, {N, Hl * d});
  a.kv = be.Scratch(DType::kF32, {N, d});
  a.o = be.Scratch(DType::kF32, {N, Hl * d});
  a.oa = be.Scratch(DType::kF32, {N, (int64_t)layout_.local_groups * c.o_lora_rank});
  const LayerState& ls = first.state->layers[b.layer];
  if (b.kind != AttentionKind::kSliding) {
    a.ckv = be.Scratch(DType::kF32, {N, ls.compressor.width()});
    a.cscore = be.Scratch(DType::kF32, {N, ls.compressor.width()});
  }
  if (b.kind == AttentionKind::kCompressedSparse) {
    a.ikv = be.Scratch(DType::kF32, {N, ls.indexer.width()});
    a.iscore = be.Scratch(DType::kF32, {N, ls.indexer.width()});
    a.iq = be.Scratch(DType::kF32, {N, (int64_t)c.index_n_heads * c.index_head_dim});
    a.iw = be.Scratch(DType::kF32, {N, (int64_t)c.index_n_heads});
    a.topk = be.Scratch(DType::kI32, {N, (int64_t)c.index_topk});
  }
  return a;
}

void ModelImpl::CompressorUpdate(const CompressorWeights& w, const Tensor& kvp, const Tensor& score, int layer,
                                 bool indexer, const std::vector<SeqRows>& seqs) {
  Backend& be = *backend_;
  const CompressorState& first = indexer ? seqs[0].state->layers[layer].indexer : seqs[0].state->layers[layer].compressor;
  std::vector<PagedRows> entries(seqs.size());
  std::vector<Backend::CompressorSeq> parts;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqRows& s = seqs[i];
    CompressorState& cs = indexer ? s.state->layers[layer].indexer : s.state->layers[layer].compressor;
    entries[i] = s.state->Entries(layer, indexer, s.table);
    parts.push_back({s.offset, s.count, s.start, cs.num_entries, &cs.pending_kv, &cs.pending_score, &entries[i]});
  }
  Backend::CompressorSpec spec;
  spec.ratio = first.ratio;
  spec.overlap = first.overlap;
  spec.dim = first.dim;
  spec.rope_dim = config_.rope_dim;
  spec.norm = &w.norm;
  spec.eps = static_cast<float>(config_.rms_norm_eps);
  spec.inv_freq = &inv_freq_[layer];
  spec.ape = &w.ape;  // the position bias, added inside the step
  be.CompressorStep(kvp, score, spec, parts);
  for (const SeqRows& s : seqs) {
    CompressorState& cs = indexer ? s.state->layers[layer].indexer : s.state->layers[layer].compressor;
    cs.num_entries = std::max(cs.num_entries, (s.start + s.count) / cs.ratio);
  }
}

void ModelImpl::AttentionInputs(const BlockWeights& b, const std::vector<int64_t>& positions, BlockActivations* a) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const AttentionWeights& w = b.attn;
  const int64_t d = c.head_dim, Hl = layout_.local_heads;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const std::vector<float>& inv = inv_freq_[b.layer];
  const Tensor& x = a->y;

  const bool compressed = b.kind != AttentionKind::kSliding, sparse = b.kind == AttentionKind::kCompressedSparse;
  // Every projection of x at once (a device backend may overlap them), then those of the normed q_a.
  std::vector<Backend::LinearJob> from_x = {{&x, &w.wq_a, &a->qr}, {&x, &w.wkv, &a->kv}};
  if (compressed) {
    from_x.push_back({&x, &w.compressor.wkv, &a->ckv});
    from_x.push_back({&x, &w.compressor.wgate, &a->cscore});
  }
  if (sparse) {
    from_x.push_back({&x, &w.indexer_compressor.wkv, &a->ikv});
    from_x.push_back({&x, &w.indexer_compressor.wgate, &a->iscore});
    from_x.push_back({&x, &w.indexer_weights_proj, &a->iw});
  }
  be.LinearBatch(from_x);
  be.RmsNorm(a->qr, c.q_lora_rank, &w.q_norm, eps, &a->qr);
  std::vector<Backend::LinearJob> from_qr = {{&a->qr, &w.wq_b, &a->q}};
  if (sparse) from_qr.push_back({&a->qr, &w.indexer_wq_b, &a->iq});
  be.LinearBatch(from_qr);

  be.RmsNorm(a->q, d, nullptr, eps, &a->q);  // per-head, weightless
  be.Rope(&a->q, Hl, d, c.rope_dim, positions.data(), inv, false);
  be.RmsNorm(a->kv, d, &w.kv_norm, eps, &a->kv);
  be.Rope(&a->kv, 1, d, c.rope_dim, positions.data(), inv, false);
  if (sparse) {
    const int64_t hi = c.index_n_heads, di = c.index_head_dim;
    be.Rope(&a->iq, hi, di, c.rope_dim, positions.data(), inv, false);
    be.Scale(&a->iw,
             static_cast<float>(1.0 / std::sqrt(static_cast<double>(di)) / std::sqrt(static_cast<double>(hi))));
  }
}

void ModelImpl::AttentionCore(const BlockWeights& b, const std::vector<SeqRows>& seqs,
                              const std::vector<int64_t>& positions, BlockActivations* a) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int64_t d = c.head_dim, Hl = layout_.local_heads;

  // Compressed entries first: a query may use every window completed up to and including itself.
  if (b.kind != AttentionKind::kSliding) {
    Phase phase(be, "compressor");
    CompressorUpdate(b.attn.compressor, a->ckv, a->cscore, b.layer, false, seqs);
  }
  if (b.kind == AttentionKind::kCompressedSparse) {
    Phase phase(be, "indexer + top-k");
    CompressorUpdate(b.attn.indexer_compressor, a->ikv, a->iscore, b.layer, true, seqs);
    const int64_t hi = c.index_n_heads, di = c.index_head_dim;
    std::vector<PagedRows> keys(seqs.size());
    std::vector<Backend::IndexerSeq> parts(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SeqRows& s = seqs[i];
      keys[i] = s.state->Entries(b.layer, true, s.table);
      parts[i] = {s.offset, s.count, &keys[i], s.state->layers[b.layer].indexer.num_entries};
    }
    be.IndexerTopKBatch(a->iq, a->iw, hi, di, positions.data(), b.ratio, c.index_topk, parts, &a->topk);
  }

  const float softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const bool compressed = b.kind != AttentionKind::kSliding;
  Phase phase(be, "attention core");
  // Every sequence of the step in one call (a device backend launches them together), but for those with
  // image spans, then the rings.
  std::vector<PagedRows> entries(seqs.size());
  std::vector<Backend::AttentionSeq> parts;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqRows& s = seqs[i];
    LayerState& ls = s.state->layers[b.layer];
    if (compressed) entries[i] = s.state->Entries(b.layer, false, s.table);
    if (!s.images || s.images->spans.empty()) {
      parts.push_back({s.offset, s.count, s.start, &ls.ring, compressed ? &entries[i] : nullptr,
                       compressed ? ls.compressor.num_entries : 0});
      continue;
    }
    // Rows inside an image span see back to min(window start, IMAGE_START) and forward to IMAGE_END
    // (docs/vision.md (b)); the others keep the causal window.
    std::vector<int64_t> from(s.count), to(s.count);
    for (int64_t r = 0; r < s.count; ++r) {
      const int64_t t = s.start + r;
      from[r] = std::max<int64_t>(0, t - c.sliding_window + 1);
      to[r] = t;
    }
    for (const StepImageRows::Span& sp : s.images->spans)
      for (int64_t r = sp.first; r <= sp.last; ++r) {
        const int64_t t = s.start + r;
        from[r] = std::max<int64_t>(0, std::min<int64_t>(t - c.sliding_window + 1, s.start + sp.first));
        to[r] = s.start + sp.last;
      }
    Tensor ov = RowView(a->o, s.offset, s.count), tv;
    if (a->topk.data) tv = RowView(a->topk, s.offset, s.count);
    be.SpanWindowAttention(RowView(a->q, s.offset, s.count), Hl, d, s.start, ls.ring,
                           RowView(a->kv, s.offset, s.count), c.sliding_window, from.data(), to.data(),
                           compressed ? &entries[i] : nullptr, compressed ? ls.compressor.num_entries : 0, b.ratio,
                           a->topk.data ? &tv : nullptr, b.attn.sinks, softmax_scale, &ov);
  }
  be.AttentionBatch(a->q, Hl, d, a->kv, c.sliding_window, b.ratio, a->topk.data ? &a->topk : nullptr, b.attn.sinks,
                    softmax_scale, parts, &a->o);
  // The window rings (UpdateRing's rows: the last min(count, slots) of each sequence) in one batch.
  std::vector<Backend::RingWrite> ring_writes;
  for (const SeqRows& s : seqs) {
    Tensor& ring = s.state->layers[b.layer].ring;
    const int64_t keep = std::min(s.count, ring.shape[0]);
    ring_writes.push_back({&a->kv, s.offset + s.count - keep, s.start + s.count - keep, keep, &ring});
  }
  be.RingWriteBatch(ring_writes);
}

void ModelImpl::AttentionOutput(const BlockWeights& b, const std::vector<int64_t>& positions, BlockActivations* a) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  be.Rope(&a->o, layout_.local_heads, c.head_dim, c.rope_dim, positions.data(), inv_freq_[b.layer],
          true);  // undo the rope the values carried
  be.GroupedLinear(a->o, b.attn.wo_a, layout_.local_groups, &a->oa);
  be.Linear(a->oa, b.attn.wo_b, &a->attn_out);
}

void ModelImpl::MoeBlock(const BlockWeights& b, const Tensor& x, const std::vector<int32_t>& tokens,
                         const std::vector<uint8_t>& image_rows, Tensor* out) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const MoeWeights& m = b.moe;
  const int64_t N = x.shape[0];
  Phase phase(be, "router");
  Tensor logits = be.Scratch(DType::kF32, {N, (int64_t)c.n_routed_experts});
  be.Linear(x, m.gate, &logits);
  RouterParams p;
  p.top_k = c.num_experts_per_tok;
  p.normalize = c.norm_topk_prob;
  p.routed_scale = static_cast<float>(c.routed_scaling_factor);
  p.hash = c.mlp_kind(b.layer) == MlpKind::kHashMoe;
  p.bias = p.hash ? nullptr : &m.bias;
  p.tid2eid = p.hash ? &m.tid2eid : nullptr;
  if (!image_rows.empty()) {
    p.image_rows = image_rows.data();
    p.bias_vl = &m.bias_vl;
  }
  Tensor idx = be.Scratch(DType::kI32, {N, (int64_t)p.top_k});
  Tensor wt = be.Scratch(DType::kF32, {N, (int64_t)p.top_k});
  be.MoeRoute(logits, tokens.data(), p, &idx, &wt);
  const float limit = static_cast<float>(c.swiglu_limit);
  {
    Phase phase(be, "routed experts");
    be.MoeExpertsInto(x, idx, wt, m.experts, limit, out);  // out = the routed experts' sum
  }
  if (m.has_shared) {
    Phase phase(be, "shared expert");
    be.SharedExpert(x, m.shared, limit, out);
  }
}

void ModelImpl::RunBlock(const BlockWeights& b, const std::vector<SeqRows>& seqs,
                         const std::vector<int64_t>& positions, const std::vector<int32_t>& tokens, Tensor* X,
                         const std::vector<uint8_t>& image_rows) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int hc = c.hc_mult;
  const int64_t N = X->shape[0];
  const float eps = static_cast<float>(c.rms_norm_eps), hc_eps = static_cast<float>(c.hc_eps);
  const size_t block_mark = be.ScratchMark();
  BlockActivations a = AllocateBlockActivations(b, seqs[0], N);

  // The stateful part's launches depend on how the rows split into sequences: the counts in order, as one
  // number.
  uint64_t pattern = 1469598103934665603ull;  // FNV-1a
  for (const SeqRows& s : seqs) pattern = (pattern ^ static_cast<uint64_t>(s.count)) * 1099511628211ull;
  const int64_t pattern_key = static_cast<int64_t>(pattern >> 1);
  auto attention_inputs = [&] {
    be.Segment({kAttentionInputSite, b.layer, N, 0}, [&] {
      Phase phase(be, "attention inputs (hc, norms, projections, rope)");
      be.HcPreNorm(*X, b.hc_attn.fn, b.hc_attn.base, b.hc_attn.scale, hc, c.hc_sinkhorn_iters, hc_eps, eps,
                   &b.attn_norm, eps, &a.y, &a.post, &a.comb);
      AttentionInputs(b, positions, &a);
    });
  };
  auto attention_core = [&] {
    const size_t mark = be.ScratchMark();  // the stateful part's temporaries vary from step to step
    auto core = [&] { AttentionCore(b, seqs, positions, &a); };
    if (image_rows.empty()) {
      be.StatefulSegment({kAttentionCoreSite, b.layer, N, pattern_key}, core);
    } else {
      core();  // rows in image spans take the span attention, one sequence at a time
    }
    be.ReleaseScratch(mark);
  };
  auto attention_output = [&] {
    Phase phase(be, "attention output (de-rope, wo_a, wo_b)");
    AttentionOutput(b, positions, &a);
  };
  auto ffn = [&] {
    Phase phase(be, "hc post/pre + norms");
    be.HcPost(*X, a.attn_out, a.post, a.comb, hc, &a.X2);
    be.HcPreNorm(a.X2, b.hc_ffn.fn, b.hc_ffn.base, b.hc_ffn.scale, hc, c.hc_sinkhorn_iters, hc_eps, eps,
                 &b.ffn_norm, eps, &a.y, &a.post, &a.comb);
    MoeBlock(b, a.y, tokens, image_rows, &a.moe_out);
  };
  auto ffn_post = [&] {
    Phase phase(be, "hc post/pre + norms");
    be.HcPost(a.X2, a.moe_out, a.post, a.comb, hc, X);
  };
  if (comm_->world() == 1 && image_rows.empty()) {
    // No collective anywhere in the block: the attention output, the FFN and the block's last hc post are
    // one segment, and the whole block may be one record (Backend::BlockSegment).
    be.BlockSegment({kBlockSite, b.layer, N, pattern_key}, [&] {
      attention_inputs();
      attention_core();
      be.Segment({kOutputFfnSite, b.layer, N, 0}, [&] {
        attention_output();
        ffn();
        ffn_post();
      });
    });
  } else {
    attention_inputs();
    attention_core();
    be.Segment({kAttentionOutputSite, b.layer, N, 0}, attention_output);
    AllReduce(&a.attn_out);
    SegmentUnlessImages(be, {kFfnSite, b.layer, N, 0}, !image_rows.empty(), ffn);
    AllReduce(&a.moe_out);
    ffn_post();
  }
  be.ReleaseScratch(block_mark);
}

Tensor ModelImpl::HeadLocalLogits(const Tensor& Xs, const HcWeights& hc_head, const Tensor& norm,
                                  int64_t step_rows, const LinearWeight* head) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int64_t D = c.hidden_size, R = Xs.shape[0];
  const float eps = static_cast<float>(c.rms_norm_eps);
  const bool draft = head != nullptr;
  if (!draft) head = &weights_.head;
  Tensor z = be.Scratch(DType::kF32, {R, D});
  Tensor lv = be.Scratch(DType::kF32, {R, head->out});
  Phase phase(be, draft ? "draft head + logits" : "head + logits");
  be.Segment({draft ? kDraftHeadSite : kHeadSite, -1, R, step_rows}, [&] {
    be.HcHead(Xs, hc_head.fn, hc_head.base, hc_head.scale, c.hc_mult, static_cast<float>(c.hc_eps), eps, &z);
    be.RmsNorm(z, D, &norm, eps, &z);
    be.Linear(z, *head, &lv);
  });
  return lv;
}

bool ModelImpl::GathersLogitsOnDevice() const {
  const int world = comm_->world();
  return world > 1 && comm_->device_buffers() && !backend_->host_memory() &&
         weights_.head_rows_per_rank * world == config_.vocab_size && weights_.head.out == weights_.head_rows_per_rank;
}

Tensor ModelImpl::GatherLogitsOnDevice(const Tensor& local) {
  Backend& be = *backend_;
  const int64_t world = comm_->world(), R = local.shape[0], per = local.shape[1];
  Tensor all = be.Scratch(DType::kF32, {world * R, per});  // [rank][row][per]
  {
    Phase phase(be, "collectives");
    comm_->AllGather(static_cast<const float*>(local.data), static_cast<size_t>(R * per), all.as<float>());
  }
  // Row r of the result is rank 0's slice of row r, then rank 1's, ...: as [R * world, per] blocks,
  // block r * world + w is rank w's row r.
  Tensor full = be.Scratch(DType::kF32, {R, world * per});
  Tensor blocks = full;
  blocks.shape = {R * world, per};
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < world; ++w) be.CopyRows(all, w * R + r, &blocks, r * world + w, 1);
  return full;
}

Tensor ModelImpl::HeadLogits(const Tensor& Xs, const HcWeights& hc_head, const Tensor& norm, int64_t step_rows) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int64_t R = Xs.shape[0];
  const int64_t V = c.vocab_size, per = weights_.head_rows_per_rank, Vl = weights_.head.out;
  Tensor lv = HeadLocalLogits(Xs, hc_head, norm, step_rows);
  Phase phase(be, "head + logits");
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

Tensor ModelImpl::DraftHeadLogits(const Tensor& Xs, const HcWeights& hc_head, const Tensor& norm) {
  if (weights_.draft_rows == 0) return HeadLogits(Xs, hc_head, norm, /*step_rows=*/0);
  Backend& be = *backend_;
  const int64_t R = Xs.shape[0], V = config_.vocab_size, n = weights_.draft_rows;
  // Every rank holds the same rows and computes the same logits: nothing to gather.
  Tensor lv = HeadLocalLogits(Xs, hc_head, norm, /*step_rows=*/0, &weights_.draft_head);
  Phase phase(be, "draft head + logits");
  Tensor out = AllocateTensor(DType::kF32, {R, V});
  std::vector<float> local(static_cast<size_t>(R * n));
  be.ToHost(lv, local.data());
  float* dst = out.as<float>();
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(dst + r * V, &local[r * n], n * sizeof(float));
    std::fill(dst + r * V + n, dst + (r + 1) * V, -std::numeric_limits<float>::infinity());
  }
  return out;
}

void ModelImpl::RecordMtpInput(const Tensor& X, const Tensor& h, const std::vector<SeqRows>& seqs,
                               const std::vector<int32_t>& tokens) {
  // Every speculating sequence's rows go into its history ring in one RingWriteBatch (on the GPU one
  // launch per 16 sequences, not one or two each): a step pays this whether or not it drafts.
  std::vector<Backend::RingWrite> writes;
  for (const SeqRows& s : seqs) {
    MtpState& m = s.state->mtp;
    if (!m.enabled()) continue;
    const int64_t slots = m.hidden.shape[0], end = s.start + s.count;
    const int64_t from = std::max(s.start, end - slots);
    writes.push_back({&X, s.offset + (from - s.start), from, end - from, &m.hidden});
    for (int64_t p = from; p < end; ++p) m.tokens[p % slots] = tokens[s.offset + (p - s.start)];
    if (m.is_image.empty()) continue;  // a text model keeps no image rows
    for (int64_t p = from; p < end; ++p) m.is_image[p % slots] = 0;
    if (s.images) RecordMtpImageRows(h, s, from, &m);
  }
  if (!writes.empty()) backend_->RingWriteBatch(writes);
}

void ModelImpl::RecordMtpImageRows(const Tensor& h, const SeqRows& s, int64_t from, MtpState* m) {
  const std::vector<int64_t>& rows = s.images->rows;
  const int64_t slots = m->image.shape[0];
  // One ring copy per run of consecutive kept image rows (an image block is one run).
  for (size_t i = 0; i < rows.size();) {
    if (s.start + rows[i] < from) {  // older than the history keeps
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    RingPut(*backend_, h, s.offset + rows[i], s.start + rows[i], static_cast<int64_t>(j - i), &m->image);
    for (size_t q = i; q < j; ++q) m->is_image[(s.start + rows[q]) % slots] = 1;
    i = j;
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
  std::vector<uint8_t> image_rows;  // one flag per row once any sequence has image rows
  for (const SequenceStep& step : batch) {
    SequenceStateData* st = &step.state->data();
    st->EnsureBlocks(st->length + static_cast<int64_t>(step.tokens.size()));
    seqs.push_back({st, (int64_t)tokens.size(), (int64_t)step.tokens.size(), st->length});
    if (!step.images.empty()) {
      seqs.back().images = &step.images;
      image_rows.resize(tokens.size() + step.tokens.size(), 0);
      for (int64_t r : step.images.rows) image_rows[tokens.size() + r] = 1;
    }
    for (size_t i = 0; i < step.tokens.size(); ++i) {
      tokens.push_back(step.tokens[i]);
      positions.push_back(st->length + (int64_t)i);
    }
  }
  const int64_t N = tokens.size();
  if (!image_rows.empty()) image_rows.resize(N, 0);
  // Every sequence's block table, one after the other: uploaded with the tokens and positions.
  std::vector<int32_t> tables;
  for (const SeqRows& s : seqs) tables.insert(tables.end(), s.state->blocks.begin(), s.state->blocks.end());
  for (size_t i = 0, at = 0; i < seqs.size(); at += seqs[i].state->blocks.size(), ++i)
    seqs[i].table = tables.data() + at;

  // The step's metadata reaches the backend once; its temporaries are released when the step ends.
  const BackendStep step_scope(be, tokens, positions, tables);
  Tensor X = be.Scratch(DType::kF32, {N, hc * D});
  Tensor h = be.Scratch(DType::kF32, {N, D});
  SegmentUnlessImages(be, {kEmbedSite, -1, N, 0}, !image_rows.empty(), [&] {
    Phase phase(be, "embedding");
    be.Embedding(weights_.embed, tokens.data(), N, &h);
    if (!image_rows.empty()) PlaceImageEmbeddings(seqs, &h);
    be.HcExpand(h, hc, &X);
  });
  for (const BlockWeights& b : weights_.layers) RunBlock(b, seqs, positions, tokens, &X, image_rows);
  for (const SeqRows& s : seqs) s.state->length += s.count;
  RecordMtpInput(X, h, seqs, tokens);

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
  Tensor Xs = X;
  if (R != N) {  // (when every row wants logits, X is the head's input as it is)
    Xs = be.Scratch(DType::kF32, {R, hc * D});
    for (int64_t r = 0; r < R; ++r) be.CopyRows(X, rows[r], &Xs, r, 1);
  }
  std::vector<SequenceOutput> outs(batch.size());
  // When every sequence asks for it, the backend samples the logits where they are and only tokens and
  // logprobs come back: on one rank, or on several whose slices are gathered on the device (each rank
  // then draws the same tokens from the same gathered rows). Otherwise the logits come to the host.
  const bool sample_on_backend =
      (comm_->world() == 1 || GathersLogitsOnDevice()) &&
      std::all_of(batch.begin(), batch.end(), [](const SequenceStep& s) { return s.sampling.has_value(); });
  Tensor logits;
  if (sample_on_backend) {
    std::vector<RowSampling> spec;
    for (size_t i = 0; i < batch.size(); ++i)
      for (int64_t r = 0, n = batch[i].all_logits ? seqs[i].count : 1; r < n; ++r) {
        spec.push_back(*batch[i].sampling);
        spec.back().position += r;
      }
    Tensor lv = HeadLocalLogits(Xs, weights_.hc_head, weights_.norm, N);
    if (comm_->world() > 1) lv = GatherLogitsOnDevice(lv);
    std::vector<SampledRow> sampled;
    {
      Phase phase(be, "sampling");
      sampled = be.SampleRows(lv, spec);
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t n = batch[i].all_logits ? seqs[i].count : 1;
      outs[i].samples.assign(sampled.begin() + first_row[i], sampled.begin() + first_row[i] + n);
    }
  } else {
    logits = HeadLogits(Xs, weights_.hc_head, weights_.norm, N);
  }
  const int64_t V = c.vocab_size;

  for (size_t i = 0; i < batch.size(); ++i) {
    int64_t n = batch[i].all_logits ? seqs[i].count : 1;
    if (!sample_on_backend) {
      Tensor lg = AllocateTensor(DType::kF32, {n, V});
      std::memcpy(lg.as<float>(), logits.as<float>() + first_row[i] * V, static_cast<size_t>(n * V) * sizeof(float));
      outs[i].logits = lg;
    }
    if (batch[i].want_hidden) {
      Tensor hid = AllocateTensor(DType::kF32, {n, hc * D});
      be.ToHost(RowView(Xs, first_row[i], n), hid.as<float>());
      outs[i].hidden = hid;
    }
  }
  return outs;
}

}  // namespace dsmesh

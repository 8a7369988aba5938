#include "kernels/cuda/cuda_moe_dispatch.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <tuple>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/model_ops.h"

namespace dsmesh {

MoeDispatch::MoeDispatch(std::shared_ptr<StreamContext> ctx, StepArena& arena, Exl3Weights& exl3,
                         CudaBackendCounters& counters, CudaBackendOptions::PrefillMoe prefill,
                         const Exl3MoeTuning& tuning)
    : ctx_(std::move(ctx)), arena_(arena), exl3_(exl3), counters_(counters), prefill_(prefill), tuning_(tuning) {}

void MoeDispatch::Run(const Tensor& x, const Tensor& idx, const Tensor& weight,
                      const std::vector<ExpertWeights>& experts, float limit, Tensor* out, bool accumulate,
                      Backend& ops) {
  const int64_t n = x.shape[0], k = RowWidth(idx);
  FusedMoe* fused = FusedFor(experts, limit, static_cast<int>(k));
  if (fused && n > kExl3MoeMaxRows && prefill_ == CudaBackendOptions::PrefillMoe::kSortedPairs &&
      k <= cuda_ops::kMoeSortMaxPairs) {
    if (!accumulate) ops.Zero(out);
    // The device sort takes at most kMoeSortMaxPairs pairs: a longer chunk runs in parts of rows (a row's
    // result depends on its own pairs only), each expert read once per part.
    const int64_t part = cuda_ops::kMoeSortMaxPairs / k;
    for (int64_t r0 = 0; r0 < n; r0 += part) {
      const int64_t m = std::min(part, n - r0);
      Tensor o = RowView(*out, r0, m);
      SortedPairs(RowView(x, r0, m), RowView(idx, r0, m), RowView(weight, r0, m), *fused, &o);
    }
    return;
  }
  if (fused && (n <= kExl3MoeMaxRows || prefill_ != CudaBackendOptions::PrefillMoe::kPerExpert)) {
    // Steps of more rows reach this only with prefill_moe = kRowSlices: the single-launch kernel on slices
    // of kExl3MoeMaxRows rows,
    // reading an expert once per slice that uses it. Each row's result does not depend on its slice. The
    // kernel overwrites its rows: without accumulation they are out's own.
    const int64_t D = RowWidth(x);
    Tensor xh = arena_.Temp(DType::kF16, {n, D});
    cuda_ops::ToHalfPadded(F(x), n, D, D, static_cast<uint16_t*>(xh.data), D, 0, ctx_->stream);
    const Tensor y = accumulate ? arena_.Temp(DType::kF32, {n, D}) : *out;
    for (int64_t r0 = 0; r0 < n; r0 += kExl3MoeMaxRows) {
      const int64_t m = std::min<int64_t>(kExl3MoeMaxRows, n - r0);
      Exl3MoeForward(fused->layer->layer(), static_cast<const uint16_t*>(xh.data) + r0 * D, I32(idx) + r0 * k,
                     F(weight) + r0 * k, static_cast<int>(m), F(y) + r0 * D, *fused->workspace, ctx_->stream);
      ++counters_.fused_moe;
    }
    if (accumulate) cuda_ops::Add(F(y), n * D, F(*out), ctx_->stream);
    CheckLaunch("MoeExperts (fused)");
    if (n > kExl3MoeMaxRows && !logged_many_rows_) {
      std::fprintf(stderr, "[cuda] routed experts: steps of more than %d rows (prefill chunks) run the fused kernel "
                           "on slices of %d rows\n", kExl3MoeMaxRows, kExl3MoeMaxRows);
      logged_many_rows_ = true;
    }
    return;
  }
  ++counters_.per_expert_moe;
  if (!accumulate) ops.Zero(out);
  // Per expert: the routing leaves the device once (a sync), rows are grouped on the host.
  std::vector<int32_t> ix(n * k);
  std::vector<float> wt(n * k);
  ops.ToHost(idx, ix.data());
  ops.ToHost(weight, wt.data());
  std::vector<std::vector<int32_t>> rows(experts.size());
  std::vector<std::vector<float>> wts(experts.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = ix[r * k + i];
      Require(e >= 0 && e < static_cast<int32_t>(experts.size()), "MoeExperts", "expert id out of range");
      rows[e].push_back(static_cast<int32_t>(r));
      wts[e].push_back(wt[r * k + i]);
    }
  for (size_t e = 0; e < experts.size(); ++e)
    if (!rows[e].empty()) RunExpert(x, rows[e], wts[e], experts[e], limit, out, ops);
}

MoeDispatch::FusedMoe* MoeDispatch::FusedFor(const std::vector<ExpertWeights>& experts, float limit, int topk) {
  std::lock_guard<std::mutex> lock(moe_mu_);
  const auto key = std::make_tuple(static_cast<const void*>(&experts), topk, limit);
  auto it = fused_.find(key);
  if (it != fused_.end()) return it->second.get();
  std::unique_ptr<FusedMoe> f;
  std::string why;
  std::vector<Exl3DeviceMoeLayer::DeviceExpert> views;
  const std::string name = experts.empty() ? "experts" : experts[0].w1.name;
  for (const ExpertWeights& e : experts) {
    const Exl3DeviceLinear* l[3] = {};
    int p = 0;
    for (const LinearWeight* lw : {&e.w1, &e.w3, &e.w2}) {
      if (!lw->is_exl3()) {
        why = "dense experts";
        break;
      }
      CudaExl3Linear& c = Exl3Weights::Of(*lw);
      if (c.weight.codebook != Exl3Codebook::kMcg) {
        why = std::string("codebook ") + Exl3CodebookName(c.weight.codebook);
        break;
      }
      if (c.weight.bias) {
        why = "expert biases";
        break;
      }
      const Exl3Part& part = exl3_.PartFor(c, c.slice.out_begin, c.slice.out_end);
      const Exl3DeviceLinear& lin = part.buffers->linear();
      if (part.x_col0 != 0 || part.kin != lin.k || part.y_col0 != 0 || part.nout != lin.n) {
        why = "expert slices not multiples of 128";
        break;
      }
      l[p++] = &lin;
    }
    if (!why.empty()) break;
    views.push_back({l[0], l[1], l[2]});
  }
  if (why.empty()) {
    try {
      f = std::make_unique<FusedMoe>();
      f->layer = std::make_unique<Exl3DeviceMoeLayer>(name, views, limit);
      const Exl3MoeLayer& ml = f->layer->layer();
      f->topk = topk;
      f->workspace = std::make_unique<Exl3MoeWorkspace>(kExl3MoeMaxRows, f->topk, ml.hidden, ml.inter, tuning_);
      why = Exl3MoeUnsupportedReason(ml, 1, f->topk);
    } catch (const std::exception& ex) {
      why = ex.what();
    }
    if (!why.empty()) f.reset();
  }
  if (!why.empty()) std::fprintf(stderr, "[cuda] %s: routed experts run per expert (%s)\n", name.c_str(), why.c_str());
  FusedMoe* raw = f.get();
  fused_[key] = std::move(f);
  return raw;
}

void MoeDispatch::SortedPairs(const Tensor& x, const Tensor& idx, const Tensor& weight, FusedMoe& fused, Tensor* out) {
  const int64_t n = x.shape[0], k = RowWidth(idx), D = RowWidth(x), P = n * k;
  const Exl3MoeLayer& layer = fused.layer->layer();
  if (!sorted_ws_ || sorted_ws_->max_rows() < P || sorted_ws_->hidden() != layer.hidden ||
      sorted_ws_->inter() != layer.inter) {
    sorted_ws_.reset();
    sorted_ws_ = Exl3MoeWorkspace::ForSortedPairs(static_cast<int>(P), layer.hidden, layer.inter, tuning_);
  }
  Tensor ids = arena_.Temp(DType::kI32, {P}), w = arena_.Temp(DType::kF32, {P}), src = arena_.Temp(DType::kI32, {P}),
         pos = arena_.Temp(DType::kI32, {P});
  int32_t* ids_p = static_cast<int32_t*>(ids.data);
  cuda_ops::SortPairsByExpert(I32(idx), F(weight), n, static_cast<int>(k), layer.num_experts, ids_p, F(w),
                              static_cast<int32_t*>(src.data), static_cast<int32_t*>(pos.data), ctx_->stream);
  Tensor xh = arena_.Temp(DType::kF16, {P, D});
  cuda_ops::GatherRowsToHalf(F(x), D, I32(src), P, static_cast<uint16_t*>(xh.data), ctx_->stream);
  Tensor y = arena_.Temp(DType::kF32, {P, D});
  Exl3MoeForwardSorted(layer, static_cast<const uint16_t*>(xh.data), ids_p, F(w), static_cast<int>(P), F(y),
                       *sorted_ws_, ctx_->stream);
  ++counters_.fused_moe;
  cuda_ops::AddPairsToRows(F(y), I32(pos), ids_p, n, static_cast<int>(k), D, F(*out), ctx_->stream);
  CheckLaunch("MoeExperts (sorted pairs)");
  if (!logged_sorted_pairs_) {
    std::fprintf(stderr, "[cuda] routed experts: steps of more than %d rows (prefill chunks) run the fused kernel "
                         "once over their (row, expert) pairs sorted by expert\n", static_cast<int>(kExl3MoeMaxRows));
    logged_sorted_pairs_ = true;
  }
}

void MoeDispatch::RunExpert(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<float>& wts,
                            const ExpertWeights& e, float limit, Tensor* out, Backend& ops) {
  const int64_t m = rows.size(), D = RowWidth(x), I = e.w1.out;
  Tensor ri = arena_.Staged(rows.data(), m);
  Tensor wv = arena_.Temp(DType::kF32, {m});
  CudaCheck(cudaMemcpyAsync(wv.data, wts.data(), m * sizeof(float), cudaMemcpyHostToDevice, ctx_->stream),
            "expert weights upload");
  Tensor xs = arena_.Temp(DType::kF32, {m, D});
  cuda_ops::GatherRows(F(x), I32(ri), m, D, F(xs), ctx_->stream);
  Tensor g = arena_.Temp(DType::kF32, {m, I}), u = arena_.Temp(DType::kF32, {m, I}), y = arena_.Temp(DType::kF32, {m, D});
  ops.Linear(xs, e.w1, &g);
  ops.Linear(xs, e.w3, &u);
  cuda_ops::SwiGlu(F(g), F(u), m * I, limit, ctx_->stream);
  ops.Linear(g, e.w2, &y);
  cuda_ops::ScatterAddRows(F(y), I32(ri), F(wv), m, D, F(*out), ctx_->stream);
  CheckLaunch("MoeExperts (per expert)");
}

}  // namespace dsmesh

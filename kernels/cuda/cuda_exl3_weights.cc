#include "kernels/cuda/cuda_exl3_weights.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "kernels/cuda/model_ops.h"

namespace dsmesh {
namespace {

// Host copy of the [k0, k1) x [n0, n1) block range of w as an Exl3Weight of its own.
Exl3Weight SubWeight(const Exl3Weight& w, int64_t k0, int64_t k1, int64_t n0, int64_t n1) {
  if (k0 == 0 && n0 == 0 && k1 == w.k_padded() && n1 == w.n_padded()) {
    Exl3Weight v = w;
    v.in_features = w.k_padded();
    v.out_features = w.n_padded();
    return v;
  }
  Exl3Weight s;
  s.K = w.K;
  s.codebook = w.codebook;
  s.name = w.name;
  s.in_features = k1 - k0;
  s.out_features = n1 - n0;
  const int64_t tile = 16 * w.K, tiles_n = w.n_padded() / 16, sub_tiles_n = (n1 - n0) / 16;
  s.trellis = AllocateTensor(DType::kI16, {(k1 - k0) / 16, sub_tiles_n, tile});
  const uint16_t* src = w.trellis.as<uint16_t>();
  uint16_t* dst = static_cast<uint16_t*>(s.trellis.data);
  for (int64_t i = 0; i < (k1 - k0) / 16; ++i)
    std::memcpy(dst + i * sub_tiles_n * tile, src + ((k0 / 16 + i) * tiles_n + n0 / 16) * tile,
                static_cast<size_t>(sub_tiles_n * tile) * 2);
  s.suh = AllocateTensor(DType::kF16, {k1 - k0});
  std::memcpy(s.suh.data, w.suh.as<uint16_t>() + k0, static_cast<size_t>(k1 - k0) * 2);
  s.svh = AllocateTensor(DType::kF16, {n1 - n0});
  std::memcpy(s.svh.data, w.svh.as<uint16_t>() + n0, static_cast<size_t>(n1 - n0) * 2);
  return s;
}

}  // namespace

Exl3Weights::Exl3Weights(std::shared_ptr<StreamContext> ctx, StepArena& arena, CudaBackendCounters& counters,
                         const Exl3GemvTuning& gemv)
    : ctx_(std::move(ctx)), arena_(arena), counters_(counters), gemv_tuning_(gemv) {}

LinearWeight Exl3Weights::Load(const Checkpoint& ckpt, const std::string& prefix, int64_t out_features,
                               int64_t in_features, int64_t out_begin, int64_t out_end, int64_t in_begin,
                               int64_t in_end) {
  auto e = std::make_shared<CudaExl3Linear>();
  e->weight = LoadExl3Weight(ckpt, prefix, in_features, out_features);
  e->slice = {in_begin, in_end, out_begin, out_end, in_begin == 0};  // input-sliced ranks: only the first adds the bias
  NoteSlice(e->slice);
  return Exl3LinearWeight(prefix, out_begin, out_end, in_begin, in_end, e);
}

LinearWeight Exl3Weights::Synthetic(const std::string& name, int64_t out_features, int64_t in_features,
                                    int64_t out_begin, int64_t out_end, int64_t in_begin, int64_t in_end, int K,
                                    uint64_t seed) {
  auto e = std::make_shared<CudaExl3Linear>();
  e->synthetic = true;
  e->seed = seed;
  e->weight.name = name;
  e->weight.K = K;
  e->weight.codebook = Exl3Codebook::kMcg;
  e->weight.in_features = in_features;
  e->weight.out_features = out_features;
  e->slice = {in_begin, in_end, out_begin, out_end, in_begin == 0};
  PartFor(*e, out_begin, out_end);  // generate now: loading is where the time and memory go
  NoteSlice(e->slice);
  return Exl3LinearWeight(name, out_begin, out_end, in_begin, in_end, e);
}

void Exl3Weights::NoteSlice(const Exl3Slice& sl) {
  const int64_t k = (sl.in_end + 127) / 128 * 128 - sl.in_begin / 128 * 128;
  const int64_t n = (sl.out_end + 127) / 128 * 128 - sl.out_begin / 128 * 128;
  max_k_ = std::max(max_k_, k);
  max_n_ = std::max(max_n_, n);
  max_weights_ = std::max(max_weights_, k * n);
}

Exl3GemvWorkspace& Exl3Weights::MainGemvWorkspace() {
  if (!gemv_ws_) gemv_ws_ = std::make_unique<Exl3GemvWorkspace>(size_t{256} << 20, gemv_tuning_);
  return *gemv_ws_;
}

Exl3Part& Exl3Weights::PartFor(CudaExl3Linear& e, int64_t out_begin, int64_t out_end) {
  std::lock_guard<std::mutex> lock(e.mu);
  const bool whole = out_begin == e.slice.out_begin && out_end == e.slice.out_end;
  std::unique_ptr<Exl3Part>& slot = whole ? e.whole : e.groups[out_begin];
  if (slot) return *slot;
  const Exl3Weight& w = e.weight;
  const int64_t in_begin = e.slice.in_begin, in_end = e.slice.in_end < 0 ? w.in_features : e.slice.in_end;
  const int64_t k0 = in_begin / 128 * 128, k1 = (in_end + 127) / 128 * 128;
  const int64_t n0 = out_begin / 128 * 128, n1 = (out_end + 127) / 128 * 128;
  auto part = std::make_unique<Exl3Part>();
  if (e.synthetic) {
    const int64_t full_k = (w.in_features + 127) / 128 * 128, full_n = (w.out_features + 127) / 128 * 128;
    part->buffers = std::make_unique<Exl3DeviceLinearBuffers>(w.name, k0, k1, n0, n1, full_k, full_n, w.K, e.seed);
  } else {
    part->buffers = std::make_unique<Exl3DeviceLinearBuffers>(SubWeight(w, k0, k1, n0, n1));
  }
  part->x_col0 = in_begin - k0;
  part->kin = in_end - in_begin;
  part->y_col0 = out_begin - n0;
  part->nout = out_end - out_begin;
  if (w.bias && e.slice.add_bias) {
    std::vector<float> b = ToFloatVector(*w.bias);
    Tensor hb = AllocateTensor(DType::kF32, {part->nout});
    std::memcpy(hb.data, b.data() + out_begin, static_cast<size_t>(part->nout) * sizeof(float));
    ctx_->Use();
    part->bias = UploadToDevice(ctx_->device, hb);
  }
  slot = std::move(part);
  return *slot;
}

void Exl3Weights::Apply(const Exl3Part& part, const float* x, int64_t ldx, int64_t m, float* out, int64_t ldo,
                        bool accumulate) {
  const cudaStream_t stream = ctx_->stream;
  const Exl3DeviceLinear& lin = part.buffers->linear();
  Tensor xh = arena_.Temp(DType::kF16, {m, lin.k});
  // A slice that is the whole block range, written plainly to a dense output, needs no column copy:
  // the kernels write `out` itself.
  const bool direct = part.y_col0 == 0 && part.nout == lin.n && ldo == lin.n && !accumulate && !part.bias.data &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
  Tensor y;
  if (direct) {
    y.dtype = DType::kF32;
    y.shape = {m, lin.n};
    y.data = out;
  } else {
    y = arena_.Temp(DType::kF32, {m, lin.n});
  }
  cuda_ops::ToHalfPadded(x, m, part.kin, ldx, static_cast<uint16_t*>(xh.data), lin.k, part.x_col0, stream);
  const uint16_t* xp = static_cast<const uint16_t*>(xh.data);
  if (m <= kExl3GemvMaxRows) {
    Exl3Gemv(lin, xp, static_cast<int>(m), y.data, Exl3Out::kF32, MainGemvWorkspace(), stream);
  } else {
    constexpr int kChunk = 512;
    // Sized for the largest linear loaded so far; a larger one loaded later gets a new workspace.
    if (!gemm_ws_ || lin.k > gemm_ws_k_ || lin.n > gemm_ws_n_ || lin.k * lin.n > gemm_ws_weights_) {
      gemm_ws_k_ = std::max(max_k_, lin.k);
      gemm_ws_n_ = std::max(max_n_, lin.n);
      gemm_ws_weights_ = std::max(max_weights_, lin.k * lin.n);
      gemm_ws_.reset();
      gemm_ws_ = std::make_unique<Exl3GemmWorkspace>(kChunk, gemm_ws_k_, gemm_ws_n_, gemm_ws_weights_);
    }
    for (int64_t r0 = 0; r0 < m; r0 += kChunk) {
      const int rows = static_cast<int>(std::min<int64_t>(kChunk, m - r0));
      Exl3Gemm(lin, xp + r0 * lin.k, rows, F(y) + r0 * lin.n, Exl3Out::kF32, *gemm_ws_, stream);
    }
  }
  if (!direct)
    cuda_ops::TakeColumns(F(y), m, lin.n, part.y_col0, part.nout, part.bias.data ? F(part.bias) : nullptr, out, ldo,
                          accumulate, stream);
  CheckLaunch("EXL3 linear");
}

void Exl3Weights::LaunchGemvBatch(const Exl3GemvJob* jobs, int count, int m) {
  Exl3GemvBatch(jobs, count, m, Exl3Out::kF32, MainGemvWorkspace(), ctx_->stream);
  CheckLaunch("EXL3 GEMV batch");
  if (count > 1) {
    ++counters_.gemv_batches;
    counters_.gemv_batched_linears += count;
    if (!logged_gemv_batch_) {
      std::fprintf(stderr, "[cuda] EXL3 linears of one layer share launches (batched GEMV, up to %d per launch)\n",
                   kExl3GemvMaxBatch);
      logged_gemv_batch_ = true;
    }
  }
}

Exl3Weights::GemvBatchPlan Exl3Weights::PlanGemvBatches(const std::vector<Backend::LinearJob>& jobs) {
  GemvBatchPlan plan;
  std::vector<GemvBatchPlan::Taken>& taken = plan.taken;
  std::vector<Backend::LinearJob>& rest = plan.rest;
  for (const Backend::LinearJob& j : jobs) {
    const int64_t m = j.x->shape[0];
    const Exl3DeviceLinear* lin = nullptr;
    if (m >= 1 && m <= kExl3GemvMaxRows && RowWidth(*j.x) == j.w->in && reinterpret_cast<uintptr_t>(j.out->data) % 16 == 0)
      lin = WholeLinear(*j.w);
    if (lin) {
      taken.push_back({&j, lin});
    } else {
      rest.push_back(j);
    }
  }
  // Sets that share a launch: same K, codebook, k and rows, at most kExl3GemvMaxBatch each.
  std::vector<std::vector<const GemvBatchPlan::Taken*>>& sets = plan.sets;
  for (const GemvBatchPlan::Taken& t : taken) {
    std::vector<const GemvBatchPlan::Taken*>* home = nullptr;
    for (auto& set : sets)
      if (set.size() < static_cast<size_t>(kExl3GemvMaxBatch) && Exl3GemvBatchable(*set[0]->lin, *t.lin) &&
          set[0]->job->x->shape[0] == t.job->x->shape[0]) {
        home = &set;
        break;
      }
    if (home) {
      home->push_back(&t);
    } else {
      sets.push_back({&t});
    }
  }
  return plan;
}

std::vector<Backend::LinearJob> Exl3Weights::RunGemvBatches(const GemvBatchPlan& plan) {
  std::vector<Backend::LinearJob> rest = plan.rest;
  std::vector<std::pair<const float*, Tensor>> halves;  // one fp16 copy per distinct input
  const auto half_of = [&](const Tensor& x) -> const uint16_t* {
    for (const auto& [src, h] : halves)
      if (src == F(x)) return static_cast<const uint16_t*>(h.data);
    const int64_t m = x.shape[0], k = RowWidth(x);
    Tensor h = arena_.Temp(DType::kF16, {m, k});
    cuda_ops::ToHalfPadded(F(x), m, k, k, static_cast<uint16_t*>(h.data), k, 0, ctx_->stream);
    halves.emplace_back(F(x), h);
    return static_cast<const uint16_t*>(h.data);
  };
  for (const auto& set : plan.sets) {
    if (set.size() == 1) {  // nothing to share: the ordinary path (its own profile entry)
      rest.push_back(*set[0]->job);
      continue;
    }
    Exl3GemvJob batch[kExl3GemvMaxBatch];
    for (size_t i = 0; i < set.size(); ++i)
      batch[i] = {set[i]->lin, half_of(*set[i]->job->x), F(*set[i]->job->out)};
    LaunchGemvBatch(batch, static_cast<int>(set.size()), static_cast<int>(set[0]->job->x->shape[0]));
  }
  return rest;
}

const Exl3DeviceLinear* Exl3Weights::WholeLinear(const LinearWeight& w) {
  if (!w.is_exl3()) return nullptr;
  CudaExl3Linear& e = Of(w);
  const Exl3Part& part = PartFor(e, e.slice.out_begin, e.slice.out_end);
  const Exl3DeviceLinear& l = part.buffers->linear();
  const bool whole = part.x_col0 == 0 && part.kin == l.k && l.k == w.in && part.y_col0 == 0 && part.nout == l.n &&
                     l.n == w.out && !part.bias.data;
  return whole ? &l : nullptr;
}

bool Exl3Weights::SharedExpertRows(const Tensor& x, const ExpertWeights& e, float limit, Tensor* out) {
  const int64_t m = x.shape[0];
  if (m < 1 || m > kExl3GemvMaxRows || x.dtype != DType::kF32 || out->dtype != DType::kF32) return false;
  const Exl3DeviceLinear* w1 = WholeLinear(e.w1);
  const Exl3DeviceLinear* w3 = WholeLinear(e.w3);
  const Exl3DeviceLinear* w2 = WholeLinear(e.w2);
  if (!w1 || !w3 || !w2 || !Exl3GemvBatchable(*w1, *w3) || w1->n != w3->n || w2->k != w1->n ||
      RowWidth(x) != w1->k || RowWidth(*out) != w2->n || out->shape[0] != m ||
      reinterpret_cast<uintptr_t>(out->data) % 16 != 0)
    return false;
  const int64_t D = w1->k, I = w1->n;
  Tensor xh = arena_.Temp(DType::kF16, {m, D});
  cuda_ops::ToHalfPadded(F(x), m, D, D, static_cast<uint16_t*>(xh.data), D, 0, ctx_->stream);
  Tensor g = arena_.Temp(DType::kF32, {m, I}), u = arena_.Temp(DType::kF32, {m, I});
  const Exl3GemvJob gate_up[2] = {{w1, static_cast<const uint16_t*>(xh.data), g.data},
                                  {w3, static_cast<const uint16_t*>(xh.data), u.data}};
  LaunchGemvBatch(gate_up, 2, static_cast<int>(m));
  Tensor gh = arena_.Temp(DType::kF16, {m, I});
  cuda_ops::SwiGluToHalf(F(g), F(u), m * I, limit, static_cast<uint16_t*>(gh.data), ctx_->stream);
  const Exl3GemvJob down{w2, static_cast<const uint16_t*>(gh.data), out->data, true};
  LaunchGemvBatch(&down, 1, static_cast<int>(m));
  CheckLaunch("SharedExpert (EXL3 rows)");
  return true;
}

bool Exl3Weights::GroupedRows(const Tensor& x, const LinearWeight& w, int groups, Tensor* out) {
  CudaExl3Linear& e = Of(w);
  const int64_t out_g = w.out / groups, m = x.shape[0];
  std::vector<const Exl3Part*> parts;
  for (int g = 0; g < groups; ++g) {
    const int64_t o0 = e.slice.out_begin + g * out_g;
    const Exl3Part& part = PartFor(e, o0, o0 + out_g);
    const Exl3DeviceLinear& lin = part.buffers->linear();
    if (part.x_col0 != 0 || part.kin != lin.k || lin.k != w.in || part.y_col0 != 0 || part.nout != lin.n ||
        part.bias.data || (reinterpret_cast<uintptr_t>(F(*out) + g * out_g) % 16) != 0)
      return false;
    parts.push_back(&part);
  }
  // Group g's m input rows at xh + g * m * in (for one row that is x's own layout), its output rows at
  // yg + g * m * out_g (for one row: out itself).
  Tensor xh = arena_.Temp(DType::kF16, {m, groups * w.in});
  cuda_ops::GroupMajorToHalf(F(x), m, groups, w.in, static_cast<uint16_t*>(xh.data), ctx_->stream);
  Tensor yg = m == 1 ? *out : arena_.Temp(DType::kF32, {m, w.out});
  // The groups in batched launches of up to kExl3GemvMaxBatch linears (V4-Flash: 8 groups, one launch).
  for (int g0 = 0; g0 < groups; g0 += kExl3GemvMaxBatch) {
    const int count = std::min(groups - g0, kExl3GemvMaxBatch);
    Exl3GemvJob batch[kExl3GemvMaxBatch];
    for (int i = 0; i < count; ++i) {
      const int g = g0 + i;
      batch[i] = {&parts[g]->buffers->linear(), static_cast<const uint16_t*>(xh.data) + g * m * w.in,
                  F(yg) + g * m * out_g};
    }
    LaunchGemvBatch(batch, count, static_cast<int>(m));
  }
  if (m > 1) cuda_ops::RowMajorFromGroups(F(yg), m, groups, out_g, F(*out), ctx_->stream);
  CheckLaunch("GroupedLinear (EXL3, grouped rows)");
  return true;
}

}  // namespace dsmesh

// The CUDA backend (cuda_backend.h): the Backend seam on one device, as op dispatch: each op checks its
// shapes and launches its kernels (model_ops.h, dense_gemm.h) on the backend's stream.
// The rest is delegated to one part per job:
//   cuda_step_arena.h      the step's scratch arena, staged metadata and launch parameters (ParamStager)
//   cuda_graph_recorder.h  the CUDA graphs of both segment kinds (capture, replay, key checks)
//   cuda_exl3_weights.h    EXL3 slices and parts, GEMV / GEMM, batched GEMVs
//   cuda_moe_dispatch.h    the routed experts' paths (single-launch kernel, sorted pairs, per expert)
//   cuda_attention_paths.h which kernel one sequence's attention takes (decode split, prefill tensor cores)
//   cuda_sample_rows.h     the device row sampler's parameters and launch, and its rows back as SampledRows
//   cuda_table_cache.h     rope and routing tables uploaded once
//   cuda_backend_device.h  the device's name and memory line, programmatic dependent launch on the stream
//   cuda_backend_util.h    the stream, device allocations and the counters behind CudaBackendStats()
// State and weights come from Alloc (stream-ordered pool) and Upload (cudaMalloc); only ToHost waits.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_attention_paths.h"
#include "kernels/cuda/cuda_backend_device.h"
#include "kernels/cuda/cuda_backend_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_exl3_weights.h"
#include "kernels/cuda/cuda_graph_recorder.h"
#include "kernels/cuda/cuda_moe_dispatch.h"
#include "kernels/cuda/cuda_op_bytes.h"
#include "kernels/cuda/cuda_sample_rows.h"
#include "kernels/cuda/cuda_step_arena.h"
#include "kernels/cuda/cuda_table_cache.h"
#include "kernels/cuda/dense_gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/op_profiler.h"
#include "kernels/kv_rows.h"
#include "kernels/op_bytes.h"

namespace dsmesh {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& options)
      : ctx_(std::make_shared<StreamContext>(device)), options_(options), device_(device),
        arena_(ctx_, options.scratch_bytes, counters_) {
    const std::string variants = CudaBackendVariants(options);
    if (!variants.empty()) std::fprintf(stderr, "[cuda] %s (options)\n", variants.c_str());
    if (options.pdl) device_.EnablePdl(ctx_->stream, &counters_.pdl_launches);
  }

  ~CudaBackend() override {
    Use();
    device_.ReleasePdl(ctx_->stream, counters_.pdl_launches);
    cudaStreamSynchronize(ctx_->stream);
  }

  std::string name() const override { return device_.name(); }
  bool host_memory() const override { return false; }

  // ---- memory ----
  Tensor Alloc(DType dtype, std::vector<int64_t> shape) override {
    Use();
    return PoolAlloc(ctx_, dtype, std::move(shape));
  }

  void Zero(Tensor* t) override {
    const ProfileScope ps = Profile("Zero");
    Use();
    ps.Bytes(static_cast<double>(t->nbytes()));
    if (t->nbytes() > 0) CudaCheck(cudaMemsetAsync(t->data, 0, t->nbytes(), ctx_->stream), "Zero");
  }

  // ---- step scope ----
  void BeginStep(const StepMetadata& step) override {
    Use();
    Require(!arena_.capturing(), "BeginStep", "called inside a graph segment");
    if (profiler_) profiler_->BeginStep();
    recorder_.BeginStep();
    arena_.Begin(step);
    step_timer_.emplace(counters_.step_wall_ns);
  }

  void EndStep() override {
    if (profiler_) profiler_->EndStep();
    recorder_.EndStep();
    arena_.End();
    step_timer_.reset();  // adds the step's wall time
    ++counters_.steps;
  }

  Tensor Scratch(DType dtype, std::vector<int64_t> shape) override { return arena_.Temp(dtype, std::move(shape)); }
  size_t ScratchMark() override { return arena_.top(); }
  void ReleaseScratch(size_t mark) override {
    Require(mark <= arena_.top(), "ReleaseScratch", "mark above the arena's top");
    arena_.SetTop(mark);
  }

  void Segment(const SegmentKey& key, const std::function<void()>& ops) override {
    recorder_.Segment(key, options_.cuda_graphs && !profiler_, ops);
  }
  void StatefulSegment(const SegmentKey& key, const std::function<void()>& ops) override {
    recorder_.StatefulSegment(key, options_.cuda_graphs && options_.stateful_graphs && !profiler_, ops);
  }
  void BlockSegment(const SegmentKey& key, const std::function<void()>& ops) override {
    recorder_.BlockSegment(key, options_.cuda_graphs && options_.stateful_graphs && options_.block_graphs && !profiler_,
                           ops);
  }

  void SetOpProfiling(OpProfiling mode) override {
    Use();
    profiler_.reset();
    if (mode != OpProfiling::kOff)
      profiler_ = std::make_unique<OpProfiler>(ctx_->stream, mode == OpProfiling::kDeviceOnly);
  }
  std::string MemoryDescription() const override {
    Use();
    return device_.MemoryDescription();
  }

  OpProfile TakeOpProfile() override { return profiler_ ? profiler_->Take() : OpProfile{}; }
  void TraceStepGraphs(bool on) override { recorder_.Trace(on); }
  StepGraphProfile TakeStepGraphs(int replays) override { return recorder_.TakeTrace(replays); }
  void BeginPhase(const char* phase) override {
    if (profiler_) profiler_->BeginPhase(phase);
  }
  void EndPhase() override {
    if (profiler_) profiler_->EndPhase();
  }

  Tensor Upload(const Tensor& host) override {
    Use();
    return UploadToDevice(ctx_->device, host);
  }

  void ToHost(const Tensor& src, void* dst) override {
    const ProfileScope ps = Profile("ToHost");
    Use();
    // A copy to the host cannot be part of a graph: refuse before the stream sees it, so that the
    // capture ends cleanly and the segment runs eagerly (Capture counts the failure).
    if (arena_.capturing()) throw std::runtime_error("ToHost inside a graph segment (the op needs its result on the host)");
    if (src.nbytes() > 0)
      CudaCheck(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, ctx_->stream), "ToHost copy");
    SynchronizeTimed("ToHost (an earlier kernel of this step failed)");
  }

  void FromHost(const void* src, Tensor* dst) override {
    const ProfileScope ps = Profile("FromHost");
    Use();
    if (dst->nbytes() > 0)
      CudaCheck(cudaMemcpyAsync(dst->data, src, dst->nbytes(), cudaMemcpyHostToDevice, ctx_->stream), "FromHost copy");
    SynchronizeTimed("FromHost");
  }

  void CopyRowsBatch(const std::vector<RowCopy>& copies) override {
    if (copies.empty()) return;
    const ProfileScope ps = Profile("CopyRowsBatch");
    Use();
    std::vector<cuda_ops::ByteCopy> bytes;
    for (const RowCopy& c : copies) {
      if (c.rows <= 0) continue;
      const int64_t row_bytes = RowWidth(*c.src) * static_cast<int64_t>(DTypeSize(c.src->dtype));
      Require(row_bytes == RowWidth(*c.dst) * static_cast<int64_t>(DTypeSize(c.dst->dtype)), "CopyRowsBatch",
              "row sizes differ");
      Require(c.src_row + c.rows <= c.src->shape[0] && c.dst_row + c.rows <= c.dst->shape[0], "CopyRowsBatch",
              "rows out of range");
      bytes.push_back({static_cast<const char*>(c.src->data) + c.src_row * row_bytes,
                       static_cast<char*>(c.dst->data) + c.dst_row * row_bytes, c.rows * row_bytes});
      ps.Bytes(op_bytes::Copy(c.rows * row_bytes));
    }
    const int most = cuda_ops::CopyBytesBatchMax();
    for (size_t i = 0; i < bytes.size(); i += most)
      cuda_ops::CopyBytesBatch(bytes.data() + i, static_cast<int>(std::min<size_t>(most, bytes.size() - i)), ctx_->stream);
    CheckLaunch("CopyRowsBatch");
  }

  void CopyRows(const Tensor& src, int64_t src_row, Tensor* dst, int64_t dst_row, int64_t rows) override {
    const ProfileScope ps = Profile("CopyRows");
    if (rows <= 0) return;
    Use();
    const int64_t row_bytes = RowWidth(src) * static_cast<int64_t>(DTypeSize(src.dtype));
    Require(row_bytes == RowWidth(*dst) * static_cast<int64_t>(DTypeSize(dst->dtype)), "CopyRows", "row sizes differ");
    Require(src_row + rows <= src.shape[0] && dst_row + rows <= dst->shape[0], "CopyRows", "rows out of range");
    ps.Bytes(op_bytes::Copy(rows * row_bytes));
    cuda_ops::CopyRows(src.data, src_row, dst->data, dst_row, rows, row_bytes, ctx_->stream);
    CheckLaunch("CopyRows");
  }

  LinearWeight LoadExl3Linear(const Checkpoint& ckpt, const std::string& prefix, int64_t out_features,
                              int64_t in_features, int64_t out_begin, int64_t out_end, int64_t in_begin,
                              int64_t in_end) override {
    return exl3_.Load(ckpt, prefix, out_features, in_features, out_begin, out_end, in_begin, in_end);
  }

  LinearWeight SyntheticExl3Linear(const std::string& name, int64_t out_features, int64_t in_features,
                                   int64_t out_begin, int64_t out_end, int64_t in_begin, int64_t in_end, int K,
                                   uint64_t seed) override {
    Use();
    return exl3_.Synthetic(name, out_features, in_features, out_begin, out_end, in_begin, in_end, K, seed);
  }

  // ---- elementwise and normalisation ----
  void Embedding(const Tensor& table, const int32_t* tokens, int64_t n, Tensor* out) override {
    const ProfileScope ps = Profile("Embedding");
    const int64_t D = table.shape[1];
    Require(out->shape[0] == n && RowWidth(*out) == D, "Embedding", "output shape");
    for (int64_t i = 0; i < n; ++i)
      Require(tokens[i] >= 0 && tokens[i] < table.shape[0], "Embedding", "token id out of range");
    ps.Bytes(op_bytes::Embedding(n, D, static_cast<int64_t>(DTypeSize(table.dtype))));
    Tensor ids;
    const int32_t* dev = arena_.StepTokens(tokens, n, &ids);
    cuda_ops::Embedding(table.data, WTypeOf(table.dtype, "the embedding"), D, dev, n, F(*out), ctx_->stream);
    CheckLaunch("Embedding");
  }

  void EmbeddingIds(const Tensor& table, const Tensor& ids, Tensor* out) override {
    const ProfileScope ps = Profile("EmbeddingIds");
    const int64_t D = table.shape[1], n = ids.numel();
    Require(ids.dtype == DType::kI32, "EmbeddingIds", "ids must be i32");
    Require(out->shape[0] == n && RowWidth(*out) == D, "EmbeddingIds", "output shape");
    ps.Bytes(op_bytes::Embedding(n, D, static_cast<int64_t>(DTypeSize(table.dtype))));
    if (n == 0) return;
    Use();
    cuda_ops::Embedding(table.data, WTypeOf(table.dtype, "the embedding"), D, static_cast<const int32_t*>(ids.data), n,
                        F(*out), ctx_->stream);
    CheckLaunch("EmbeddingIds");
  }

  void RmsNorm(const Tensor& x, int64_t dim, const Tensor* weight, float eps, Tensor* out) override {
    const ProfileScope ps = Profile("RmsNorm");
    const int64_t groups = x.numel() / dim;
    Require(groups * dim == x.numel() && out->numel() == x.numel(), "RmsNorm", "shape");
    ps.Bytes(op_bytes::RmsNorm(x.numel(), dim, weight != nullptr));
    Use();
    cuda_ops::RmsNorm(F(x), groups, dim, weight ? F(*weight) : nullptr, eps, F(*out), ctx_->stream);
    CheckLaunch("RmsNorm");
  }

  void Add(const Tensor& a, Tensor* acc) override {
    const ProfileScope ps = Profile("Add");
    Require(a.numel() == acc->numel(), "Add", "sizes differ");
    ps.Bytes(op_bytes::Add(a.numel()));
    Use();
    cuda_ops::Add(F(a), a.numel(), F(*acc), ctx_->stream);
    CheckLaunch("Add");
  }

  void Scale(Tensor* x, float s) override {
    const ProfileScope ps = Profile("Scale");
    ps.Bytes(op_bytes::Scale(x->numel()));
    Use();
    cuda_ops::Scale(F(*x), x->numel(), s, ctx_->stream);
    CheckLaunch("Scale");
  }

  // ---- linear ----
  void Linear(const Tensor& x, const LinearWeight& w, Tensor* out) override {
    const ProfileScope ps = Profile(LinearProfileName("Linear ", w));
    const int64_t m = x.shape[0];
    Require(RowWidth(x) == w.in, "Linear", w.name + ": input width " + std::to_string(RowWidth(x)) + " != " + std::to_string(w.in));
    Require(RowWidth(*out) == w.out && out->shape[0] == m, "Linear", w.name + ": output shape");
    if (ps.on()) ps.Bytes(LinearBytes(m, w));
    Use();
    LinearOn(x, w, out);
  }

  void LinearBatch(const std::vector<LinearJob>& jobs) override {
    for (const LinearJob& j : jobs)
      Require(RowWidth(*j.x) == j.w->in && RowWidth(*j.out) == j.w->out && j.out->shape[0] == j.x->shape[0],
              "LinearBatch", j.w->name + ": shape");
    const std::vector<LinearJob> rest = jobs.size() > 1 ? BatchedExl3Gemvs(jobs) : jobs;
    for (const LinearJob& j : rest) Linear(*j.x, *j.w, j.out);
  }

  void GroupedLinear(const Tensor& x, const LinearWeight& w, int groups, Tensor* out) override {
    const ProfileScope ps = Profile(LinearProfileName("GroupedLinear ", w));
    const int64_t m = x.shape[0], out_g = w.out / groups;
    Require(RowWidth(x) == groups * w.in && RowWidth(*out) == w.out && w.out % groups == 0, "GroupedLinear",
            w.name + ": shape");
    if (ps.on()) ps.Bytes(WeightBytes(w, groups) + op_bytes::LinearActivations(m, groups * w.in, w.out, false));
    Use();
    if (w.is_exl3() && m <= kExl3GemvMaxRows && exl3_.GroupedRows(x, w, groups, out)) return;
    for (int g = 0; g < groups; ++g) {
      if (w.is_exl3()) {
        CudaExl3Linear& e = Exl3Weights::Of(w);
        const int64_t o0 = e.slice.out_begin + g * out_g;
        exl3_.Apply(exl3_.PartFor(e, o0, o0 + out_g), F(x) + g * w.in, groups * w.in, m, F(*out) + g * out_g, w.out, false);
        continue;
      }
      const size_t es = DTypeSize(w.dense.dtype);
      const void* wg = static_cast<const char*>(w.dense.data) + static_cast<size_t>(g) * out_g * w.in * es;
      const cuda_ops::WType type = WTypeOf(w.dense.dtype, w.name);
      if (m > kGraphMaxRows && DenseGemm::Takes(type, out_g, w.in)) {
        const Tensor wf = arena_.Temp(DType::kF32, {out_g, w.in});
        dense_gemm_.Run(F(x) + g * w.in, groups * w.in, m, wg, type, out_g, w.in, F(wf), F(*out) + g * out_g, w.out,
                        ctx_->stream);
        continue;
      }
      cuda_ops::DenseLinear(F(x) + g * w.in, groups * w.in, m, wg, type, w.in, out_g, w.in, nullptr,
                            F(*out) + g * out_g, w.out, ctx_->stream);
      CheckLaunch("GroupedLinear");
    }
  }

  // ---- rope ----
  void Rope(Tensor* x, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
            const std::vector<float>& inv_freq, bool inverse) override {
    const ProfileScope ps = Profile("Rope");
    const int64_t n = x->shape[0];
    Require(RowWidth(*x) == heads * head_dim && static_cast<int64_t>(inv_freq.size()) == rope_dim / 2, "Rope", "shape");
    ps.Bytes(op_bytes::Rope(n, heads, rope_dim));
    Tensor pos;
    const int64_t* dev = arena_.StepPositions(positions, n, &pos);
    cuda_ops::Rope(F(*x), n, heads, head_dim, rope_dim, dev, tables_.Floats(inv_freq), inverse, ctx_->stream);
    CheckLaunch("Rope");
  }

  // ---- hyper-connections ----
  void HcPre(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc, int iters, float eps,
             float norm_eps, Tensor* y, Tensor* post, Tensor* comb) override {
    const ProfileScope ps = Profile("HcPre");
    LaunchHcPre("HcPre", ps, X, fn, base, scale, hc, iters, eps, norm_eps, nullptr, y, post, comb);
  }

  // y's RmsNorm in the same launch (the kernel's y blocks add their sums of y^2 through the cluster).
  void HcPreNorm(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc, int iters,
                 float eps, float norm_eps, const Tensor* y_norm, float y_norm_eps, Tensor* y, Tensor* post,
                 Tensor* comb) override {
    const ProfileScope ps = Profile("HcPreNorm");
    const HcNorm norm{y_norm, y_norm_eps};
    LaunchHcPre("HcPreNorm", ps, X, fn, base, scale, hc, iters, eps, norm_eps, &norm, y, post, comb);
  }

  void HcExpand(const Tensor& h, int hc, Tensor* X) override {
    const ProfileScope ps = Profile("HcExpand");
    ps.Bytes(op_bytes::HcExpand(h.shape[0], RowWidth(h), hc));
    Use();
    cuda_ops::HcExpand(F(h), h.shape[0], RowWidth(h), hc, F(*X), ctx_->stream);
    CheckLaunch("HcExpand");
  }

  void HcPost(const Tensor& X, const Tensor& f, const Tensor& post, const Tensor& comb, int hc, Tensor* out) override {
    const ProfileScope ps = Profile("HcPost");
    ps.Bytes(op_bytes::HcPost(X.shape[0], RowWidth(f), hc));
    Use();
    cuda_ops::HcPost(F(X), F(f), F(post), F(comb), X.shape[0], RowWidth(f), hc, F(*out), ctx_->stream);
    CheckLaunch("HcPost");
  }

  void HcHead(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc, float eps,
              float norm_eps, Tensor* y) override {
    const ProfileScope ps = Profile("HcHead");
    Require(hc <= 16, "HcHead", "hc_mult above 16");
    const int64_t n = X.shape[0], D = RowWidth(X) / hc;
    Require(fn.shape.size() == 2 && fn.shape[0] == hc && fn.shape[1] == hc * D, "HcHead", "fn shape");
    ps.Bytes(op_bytes::HcHead(n, D, hc));
    Use();
    Tensor mixes = arena_.Temp(DType::kF32, {n, static_cast<int64_t>(hc)});
    cuda_ops::HcHead(F(X), n, D, hc, F(fn), F(base), F(scale), eps, norm_eps, F(mixes), F(*y), ctx_->stream);
    CheckLaunch("HcHead");
  }

  // ---- compressor ----
  void AddPositionBias(Tensor* score, const Tensor& ape, const int64_t* positions, int ratio) override {
    const ProfileScope ps = ProfileStaged("AddPositionBias");
    const int64_t w = RowWidth(*score), n = score->shape[0];
    Require(RowWidth(ape) == w && ape.shape[0] == ratio, "AddPositionBias", "ape shape");
    ps.Bytes(op_bytes::Scale(score->numel()) + static_cast<double>(ape.nbytes()));
    Use();
    Tensor pos;
    const int64_t* dev = arena_.StepPositions(positions, n, &pos);
    if (arena_.mode() == StatefulMode::kReplaying) return;  // the record's launch reads the positions buffer
    cuda_ops::AddPositionBias(F(*score), n, w, F(ape), dev, ratio, ctx_->stream);
    CheckLaunch("AddPositionBias");
  }

  void CompressorPool(const Tensor& kv, const Tensor& score, int64_t base_pos, int64_t first_window,
                      int64_t num_windows, int ratio, bool overlap, int64_t d, Tensor* out) override {
    const ProfileScope ps = Profile("CompressorPool");
    const int64_t width = RowWidth(kv), rows = kv.shape[0];
    Require(width == (overlap ? 2 : 1) * d && RowWidth(*out) == d, "CompressorPool", "shape");
    const int64_t first_row = (overlap && first_window >= 1 ? first_window - 1 : first_window) * ratio - base_pos;
    const int64_t last_row = (first_window + num_windows) * ratio - 1 - base_pos;
    Require(num_windows <= 0 || (first_row >= 0 && last_row < rows), "CompressorPool", "window rows not provided");
    ps.Bytes(static_cast<double>(kv.nbytes() + score.nbytes()) + op_bytes::kF32 * std::max<int64_t>(num_windows, 0) * d);
    Use();
    cuda_ops::CompressorPool(F(kv), F(score), width, base_pos, first_window, num_windows, ratio, overlap, d, F(*out),
                             ctx_->stream);
    CheckLaunch("CompressorPool");
  }

  void CompressorStep(const Tensor& kv, const Tensor& score, const CompressorSpec& spec,
                      const std::vector<CompressorSeq>& seqs) override {
    const int64_t width = (spec.overlap ? 2 : 1) * spec.dim;
    bool device_op = spec.dim <= cuda_ops::CompressorStepMaxDim() &&
                     (spec.overlap ? 2 : 1) * spec.ratio <= cuda_ops::CompressorStepMaxWindowRows() &&
                     kv.dtype == DType::kF32 &&
                     score.dtype == DType::kF32 && RowWidth(kv) == width && RowWidth(score) == width;
    for (const CompressorSeq& q : seqs)
      device_op = device_op && q.pending_kv->dtype == DType::kF32 && q.pending_score->dtype == DType::kF32;
    if (!device_op) {
      arena_.Unrecordable("CompressorStep", "shapes the device op does not take");
      if (logged_fallback_.insert("CompressorStep").second)
        std::fprintf(stderr, "[cuda] CompressorStep: entry width %lld, windows of %d rows or non-f32 rows: composed "
                             "of CompressorPool, RmsNorm, Rope and StoreKvRows instead (logged once)\n",
                     static_cast<long long>(spec.dim), (spec.overlap ? 2 : 1) * spec.ratio);
      Backend::CompressorStep(kv, score, spec, seqs);
      return;
    }
    Require(!spec.ape || (spec.ape->dtype == DType::kF32 && spec.ape->shape[0] == spec.ratio &&
                          RowWidth(*spec.ape) == width),
            "CompressorStep", "ape shape");
    const ProfileScope ps = ProfileStaged("CompressorStep");
    ps.Bytes(op_bytes::Copy(static_cast<int64_t>(kv.nbytes() + score.nbytes())) +  // the step's rows into the rings
             (spec.ape ? static_cast<double>(spec.ape->nbytes()) : 0.0));
    Use();
    cuda_ops::CompressorStepArgs args;
    args.kv = F(kv);
    args.score = F(score);
    args.ape = spec.ape ? F(*spec.ape) : nullptr;
    args.ratio = spec.ratio;
    args.overlap = spec.overlap;
    args.dim = spec.dim;
    args.rope_dim = spec.rope_dim;
    args.norm = spec.norm ? F(*spec.norm) : nullptr;
    args.eps = spec.eps;
    args.inv_freq = tables_.Floats(*spec.inv_freq);
    const int most = cuda_ops::CompressorStepMaxSeqs();
    std::vector<Tensor> tables(seqs.size());
    std::vector<cuda_ops::CompressorSeqDev> dev(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const CompressorSeq& q = seqs[i];
      const int64_t end = q.start + q.count, slots = q.pending_kv->shape[0];
      Require(RowWidth(*q.pending_kv) == width && RowWidth(*q.pending_score) == width &&
                  q.pending_score->shape[0] == slots,
              "CompressorStep", "ring shapes");
      Require(q.offset + q.count <= kv.shape[0], "CompressorStep", "rows out of range");
      // The open windows' rows before `start` must still be in the ring.
      const int64_t base = spec.overlap ? std::max<int64_t>(q.num_entries - 1, 0) * spec.ratio
                                        : q.num_entries * spec.ratio;
      Require(q.start - base <= slots, "CompressorStep", "the ring does not hold the open windows");
      Require(end / spec.ratio <= q.entries->capacity(), "CompressorStep", "entry past the block table");
      dev[i].offset = q.offset;
      dev[i].count = q.count;
      dev[i].start = q.start;
      dev[i].num_entries = q.num_entries;
      dev[i].ring_kv = F(*q.pending_kv);
      dev[i].ring_score = F(*q.pending_score);
      dev[i].ring_slots = slots;
      dev[i].entries = arena_.Paged(*q.entries, std::max<int64_t>(end / spec.ratio, 1), spec.dim, &tables[i]);
    }
    for (size_t i = 0; i < dev.size(); i += most)
      cuda_ops::CompressorStep(args, dev.data() + i, static_cast<int>(std::min<size_t>(most, dev.size() - i)), arena_.stager(),
                               ctx_->stream);
    CheckLaunch("CompressorStep");
  }

  void RingWriteBatch(const std::vector<RingWrite>& writes) override {
    bool f32 = true;
    for (const RingWrite& w : writes) f32 = f32 && w.src->dtype == DType::kF32 && w.ring->dtype == DType::kF32;
    if (!f32) {
      arena_.Unrecordable("RingWriteBatch", "rings that are not f32");
      if (logged_fallback_.insert("RingWriteBatch").second)
        std::fprintf(stderr, "[cuda] RingWriteBatch: rings that are not f32 take CopyRowsBatch (logged once)\n");
      Backend::RingWriteBatch(writes);
      return;
    }
    const ProfileScope ps = ProfileStaged("RingWriteBatch");
    Use();
    std::vector<cuda_ops::RingWriteDev> dev;
    for (const RingWrite& w : writes) {
      const int64_t width = RowWidth(*w.src), slots = w.ring->shape[0];
      Require(RowWidth(*w.ring) == width, "RingWriteBatch", "row widths differ");
      Require(w.n <= slots && w.src_row + w.n <= w.src->shape[0], "RingWriteBatch", "rows out of range");
      dev.push_back({F(*w.src), w.src_row, w.pos, w.n, F(*w.ring), slots, width});
      ps.Bytes(op_bytes::Copy(w.n * width * static_cast<int64_t>(sizeof(float))));
    }
    if (!dev.empty()) cuda_ops::RingWriteBatch(dev.data(), static_cast<int>(dev.size()), arena_.stager(), ctx_->stream);
    CheckLaunch("RingWriteBatch");
  }

  // ---- indexer ----
  void IndexerTopK(const Tensor& q, const Tensor& weights, const PagedRows& keys, int64_t num_keys, int64_t heads,
                   int64_t dim, const int64_t* positions, int ratio, int top_k, Tensor* out) override {
    const ProfileScope ps = ProfileStaged("IndexerTopK");
    const int64_t n = q.shape[0];
    Require(RowWidth(*out) == top_k && out->dtype == DType::kI32, "IndexerTopK", "output shape");
    Require(num_keys <= keys.capacity(), "IndexerTopK", "more keys than the block table holds");
    ps.Bytes(op_bytes::IndexerTopK(n, heads, dim, num_keys, PoolRowBytes(keys), top_k));
    Tensor pos, table;
    const int64_t* dev = arena_.StepPositions(positions, n, &pos);
    const cuda_ops::PagedRowsDev paged = arena_.Paged(keys, num_keys, dim, &table);
    const int64_t ld = arena_.LaunchShape(arena_.IndexerKeysLd(n, num_keys, ratio));
    Tensor scratch = arena_.Temp(DType::kF32, {cuda_ops::IndexerScratchFloats(n, ld)});
    cuda_ops::IndexerTopK(F(q), F(weights), paged, num_keys, heads, dim, dev, n, ratio, top_k, ld, F(scratch),
                          static_cast<int32_t*>(out->data), arena_.stager(), ctx_->stream);
    CheckLaunch("IndexerTopK");
  }

  void IndexerTopKBatch(const Tensor& q, const Tensor& weights, int64_t heads, int64_t dim, const int64_t* positions,
                        int ratio, int top_k, const std::vector<IndexerSeq>& seqs, Tensor* out) override {
    const int64_t n = q.shape[0];
    if (seqs.size() <= 1 || n > cuda_ops::IndexerBatchMaxRows() ||
        static_cast<int>(seqs.size()) > cuda_ops::IndexerBatchMaxSeqs()) {
      if (seqs.size() > 1) PerSequenceFallback("IndexerTopKBatch", n, seqs.size(), cuda_ops::IndexerBatchMaxRows(),
                                               cuda_ops::IndexerBatchMaxSeqs());
      Backend::IndexerTopKBatch(q, weights, heads, dim, positions, ratio, top_k, seqs, out);
      return;
    }
    const ProfileScope ps = ProfileStaged("IndexerTopKBatch");
    Require(RowWidth(*out) == top_k && out->dtype == DType::kI32, "IndexerTopKBatch", "output shape");
    Use();
    std::vector<cuda_ops::IndexerSeqDev> dev(seqs.size());
    std::vector<Tensor> tables(seqs.size());
    int64_t max_keys = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const IndexerSeq& a = seqs[i];
      Require(a.num_keys <= a.keys->capacity(), "IndexerTopKBatch", "more keys than the block table holds");
      dev[i].offset = a.offset;
      dev[i].count = a.count;
      dev[i].keys = arena_.Paged(*a.keys, a.num_keys, dim, &tables[i]);
      dev[i].num_keys = a.num_keys;
      max_keys = std::max(max_keys, a.num_keys);
      ps.Bytes(op_bytes::IndexerTopK(a.count, heads, dim, a.num_keys, PoolRowBytes(*a.keys), top_k));
    }
    Tensor pos;
    const int64_t* dev_pos = arena_.StepPositions(positions, n, &pos);
    const int64_t ld = arena_.LaunchShape(arena_.IndexerKeysLd(n, max_keys, ratio));
    Tensor scratch = arena_.Temp(DType::kF32, {cuda_ops::IndexerScratchFloats(n, ld)});
    cuda_ops::IndexerTopKBatch(F(q), F(weights), dev.data(), static_cast<int>(dev.size()), heads, dim, dev_pos, n,
                               ratio, top_k, ld, F(scratch), static_cast<int32_t*>(out->data), arena_.stager(), ctx_->stream);
    CheckLaunch("IndexerTopKBatch");
  }

  // ---- attention ----
  void Attention(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring, const Tensor& new_kv,
                 int window, const PagedRows* entries, int64_t num_entries, int ratio, const Tensor* topk,
                 const Tensor& sinks, float softmax_scale, Tensor* out) override {
    const ProfileScope ps = ProfileStaged("Attention");
    Require(RowWidth(q) == heads * d && RowWidth(*out) == heads * d, "Attention", "shape");
    Require(!entries || num_entries <= entries->capacity(), "Attention", "more entries than the block table holds");
    if (ps.on())
      ps.Bytes(op_bytes::Attention(q.shape[0], heads, d, 0, 0) +
               AttentionKvBytes(q.shape[0], window, ring, entries, num_entries, topk));
    Use();
    attention_.Run(q, heads, d, start, ring, new_kv, window, entries, num_entries, ratio, topk, sinks, softmax_scale, out,
                   ctx_->stream);
  }

  void StoreKvRows(const Tensor& src, int64_t src_row, int64_t rows, int64_t rope_dim, Tensor* dst,
                   int64_t dst_row) override {
    const ProfileScope ps = Profile("StoreKvRows");
    if (rows <= 0) return;
    Use();
    const int64_t dim = RowWidth(src), bytes = KvRowBytes(dst->dtype, dim, rope_dim);
    Require(RowWidth(*dst) * static_cast<int64_t>(DTypeSize(dst->dtype)) == bytes, "StoreKvRows",
            "destination rows are not the storage's row size");
    Require(src_row + rows <= src.shape[0] && dst_row + rows <= dst->shape[0], "StoreKvRows", "rows out of range");
    ps.Bytes(op_bytes::kF32 * rows * dim + static_cast<double>(rows) * bytes);
    cuda_ops::EncodeKvRows(F(src) + src_row * dim, rows, dim, rope_dim, RowKindOf(dst->dtype), bytes,
                           static_cast<uint8_t*>(dst->data) + dst_row * bytes, ctx_->stream);
    CheckLaunch("StoreKvRows");
  }

  void AttentionBatch(const Tensor& q, int64_t heads, int64_t d, const Tensor& new_kv, int window, int ratio,
                      const Tensor* topk, const Tensor& sinks, float softmax_scale,
                      const std::vector<AttentionSeq>& seqs, Tensor* out) override {
    const int64_t n = q.shape[0];
    int64_t covered = 0;
    for (const AttentionSeq& a : seqs) covered += a.count;
    if (seqs.size() <= 1 || covered != n || n > cuda_ops::AttentionBatchMaxRows() ||
        static_cast<int>(seqs.size()) > cuda_ops::AttentionBatchMaxSeqs()) {
      if (seqs.size() > 1) PerSequenceFallback("AttentionBatch", n, seqs.size(), cuda_ops::AttentionBatchMaxRows(),
                                               cuda_ops::AttentionBatchMaxSeqs());
      Backend::AttentionBatch(q, heads, d, new_kv, window, ratio, topk, sinks, softmax_scale, seqs, out);
      return;
    }
    const ProfileScope ps = ProfileStaged("AttentionBatch");
    Require(RowWidth(q) == heads * d && RowWidth(*out) == heads * d, "AttentionBatch", "shape");
    Use();
    std::vector<cuda_ops::AttentionSeqDev> dev(seqs.size());
    std::vector<Tensor> tables(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const AttentionSeq& a = seqs[i];
      Require(a.ring && a.ring->shape[0] >= window, "AttentionBatch", "ring has fewer slots than the window");
      Require(!a.entries || a.num_entries <= a.entries->capacity(), "AttentionBatch",
              "more entries than the block table holds");
      dev[i].offset = a.offset;
      dev[i].count = a.count;
      dev[i].start = a.start;
      dev[i].ring = F(*a.ring);
      dev[i].ring_slots = a.ring->shape[0];
      if (a.entries) dev[i].entries = arena_.Paged(*a.entries, a.num_entries, d, &tables[i]);
      dev[i].num_entries = a.entries ? a.num_entries : 0;
      if (ps.on())
        ps.Bytes(op_bytes::Attention(a.count, heads, d, 0, 0) +
                 AttentionKvBytes(a.count, window, *a.ring, a.entries, a.num_entries, topk));
    }
    Tensor split = arena_.Temp(DType::kF32, {cuda_ops::AttentionSplitScratchFloats(n, heads, d)});
    cuda_ops::AttentionBatch(F(q), n, heads, d, F(new_kv), window, ratio, topk ? I32(*topk) : nullptr,
                             topk ? RowWidth(*topk) : 0, dev.data(), static_cast<int>(dev.size()), F(sinks),
                             softmax_scale, F(*out), F(split), arena_.stager(), ctx_->stream);
    CheckLaunch("AttentionBatch");
  }

  void UpdateRing(const Tensor& new_kv, int64_t start, int window, Tensor* ring) override {
    const ProfileScope ps = Profile("UpdateRing");
    Require(ring->shape[0] >= window, "UpdateRing", "ring has fewer slots than the window");
    ps.Bytes(op_bytes::Copy(static_cast<int64_t>(new_kv.nbytes())));
    Use();
    cuda_ops::UpdateRing(F(new_kv), new_kv.shape[0], RowWidth(new_kv), start, ring->shape[0], F(*ring), ctx_->stream);
    CheckLaunch("UpdateRing");
  }

  // ---- image steps and the vision tower (model_ops_vision.cu) ----
  void SpanWindowAttention(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring,
                           const Tensor& new_kv, int window, const int64_t* visible_from, const int64_t* visible_to,
                           const PagedRows* entries, int64_t num_entries, int ratio, const Tensor* topk,
                           const Tensor& sinks, float softmax_scale, Tensor* out) override {
    const ProfileScope ps = Profile("SpanWindowAttention");
    const int64_t n = q.shape[0];
    Require(RowWidth(q) == heads * d && RowWidth(*out) == heads * d && new_kv.shape[0] == n && RowWidth(new_kv) == d,
            "SpanWindowAttention", "shape");
    Require(ring.shape[0] >= window, "SpanWindowAttention", "ring has fewer slots than the window");
    Require(!entries || num_entries <= entries->capacity(), "SpanWindowAttention",
            "more entries than the block table holds");
    CheckSpanWindowBounds("cuda backend SpanWindowAttention", n, start, window, visible_from, visible_to);
    Use();
    Tensor table;
    const cuda_ops::PagedRowsDev paged = entries ? arena_.Paged(*entries, num_entries, d, &table) : cuda_ops::PagedRowsDev{};
    const Tensor from = arena_.Staged(visible_from, n), to = arena_.Staged(visible_to, n);
    cuda_ops::SpanWindowAttention(F(q), n, heads, d, start, F(ring), ring.shape[0], F(new_kv),
                                  static_cast<const int64_t*>(from.data), static_cast<const int64_t*>(to.data), paged,
                                  num_entries, ratio, topk ? I32(*topk) : nullptr, topk ? RowWidth(*topk) : 0,
                                  F(sinks), softmax_scale, F(*out), ctx_->stream);
    CheckLaunch("SpanWindowAttention");
  }

  bool supports_image_rows() const override { return true; }

  void RotateHalf(Tensor* x, int64_t heads, int64_t head_dim, const Tensor& angles) override {
    const ProfileScope ps = Profile("RotateHalf");
    const int64_t n = x->shape[0];
    Require(RowWidth(*x) == heads * head_dim && head_dim % 2 == 0 && angles.dtype == DType::kF32 &&
                angles.numel() == n * (head_dim / 2),
            "RotateHalf", "shape");
    Use();
    cuda_ops::RotateHalf(F(*x), n, heads, head_dim, F(angles), ctx_->stream);
    CheckLaunch("RotateHalf");
  }

  void SpanAttention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads, int64_t d, const int64_t* spans,
                     int64_t num_spans, float softmax_scale, Tensor* out) override {
    const ProfileScope ps = Profile("SpanAttention");
    const int64_t n = q.shape[0];
    Require(RowWidth(q) == heads * d && RowWidth(k) == heads * d && RowWidth(v) == heads * d &&
                RowWidth(*out) == heads * d && k.shape[0] == n && v.shape[0] == n && out->shape[0] == n,
            "SpanAttention", "shape");
    Require(d <= cuda_ops::SpanAttentionMaxHeadDim(), "SpanAttention",
            "head_dim " + std::to_string(d) + " above " + std::to_string(cuda_ops::SpanAttentionMaxHeadDim()));
    Require(spans && num_spans >= 0 && spans[0] == 0 && spans[num_spans] == n && n < INT32_MAX, "SpanAttention",
            "spans must run from 0 to the row count");
    for (int64_t s = 0; s < num_spans; ++s) Require(spans[s] <= spans[s + 1], "SpanAttention", "spans out of order");
    Use();
    const std::vector<int32_t> tiles = cuda_ops::SpanAttentionTiles(spans, num_spans);
    if (tiles.empty()) return;
    const Tensor dev = arena_.Staged(tiles.data(), static_cast<int64_t>(tiles.size()));
    cuda_ops::SpanAttention(F(q), F(k), F(v), heads, d, I32(dev), static_cast<int64_t>(tiles.size() / 4), softmax_scale,
                            F(*out), ctx_->stream);
    CheckLaunch("SpanAttention");
  }

  void Gelu(Tensor* x) override {
    const ProfileScope ps = Profile("Gelu");
    Require(x->dtype == DType::kF32, "Gelu", "f32 only");
    Use();
    cuda_ops::Gelu(F(*x), x->numel(), ctx_->stream);
    CheckLaunch("Gelu");
  }

  void Unfold2D(const Tensor& x, int64_t h, int64_t w, int r, Tensor* out) override {
    const ProfileScope ps = Profile("Unfold2D");
    const int64_t C = RowWidth(x);
    Require(h > 0 && w > 0 && r > 0 && x.shape[0] == h * w, "Unfold2D", "x must hold h*w rows");
    Require(out->shape[0] == ((h + r - 1) / r) * ((w + r - 1) / r) && RowWidth(*out) == C * r * r, "Unfold2D",
            "output shape");
    Use();
    cuda_ops::Unfold2D(F(x), h, w, C, r, F(*out), ctx_->stream);
    CheckLaunch("Unfold2D");
  }

  // ---- MoE ----
  void MoeRoute(const Tensor& logits, const int32_t* tokens, const RouterParams& p, Tensor* idx,
                Tensor* weight) override {
    const ProfileScope ps = Profile("MoeRoute");
    const int64_t n = logits.shape[0], E = RowWidth(logits);
    Require(RowWidth(*idx) == p.top_k && RowWidth(*weight) == p.top_k, "MoeRoute", "output shape");
    Require(!p.image_rows || (p.bias_vl && p.bias_vl->numel() == E), "MoeRoute", "image rows without bias_vl [E]");
    ps.Bytes(op_bytes::MoeRoute(n, E, p.top_k, !p.hash && p.bias && p.bias->data) + (p.hash ? 4.0 * n * p.top_k : 0));
    Tensor toks;
    const int32_t* table = nullptr;
    const int32_t* dev_tokens = nullptr;
    if (p.hash) {
      Require(p.tid2eid && p.tid2eid->data, "MoeRoute", "hash layer without tid2eid");
      dev_tokens = arena_.StepTokens(tokens, n, &toks);
      table = tables_.Ints(*p.tid2eid);
    }
    Use();
    cuda_ops::MoeRoute(F(logits), n, E, dev_tokens, table,
                       !p.hash && p.bias && p.bias->data ? F(*p.bias) : nullptr, p.top_k, p.normalize, p.routed_scale,
                       static_cast<int32_t*>(idx->data), F(*weight), ctx_->stream);
    // Image rows (hash layers too) are routed again, each run of consecutive ones in one launch:
    // top_k(score + bias_vl), weights from the unbiased scores.
    for (int64_t r0 = 0; p.image_rows && r0 < n;) {
      if (!p.image_rows[r0]) {
        ++r0;
        continue;
      }
      int64_t r1 = r0 + 1;
      while (r1 < n && p.image_rows[r1]) ++r1;
      cuda_ops::MoeRoute(F(logits) + r0 * E, r1 - r0, E, nullptr, nullptr, F(*p.bias_vl), p.top_k, p.normalize,
                         p.routed_scale, static_cast<int32_t*>(idx->data) + r0 * p.top_k, F(*weight) + r0 * p.top_k,
                         ctx_->stream);
      r0 = r1;
    }
    CheckLaunch("MoeRoute");
  }

  void MoeExperts(const Tensor& x, const Tensor& idx, const Tensor& weight, const std::vector<ExpertWeights>& experts,
                  float limit, Tensor* out) override {
    RoutedExperts(x, idx, weight, experts, limit, out, /*accumulate=*/true);
  }
  // The fused decode path writes the experts' sum into out itself: no zeroing and no add.
  void MoeExpertsInto(const Tensor& x, const Tensor& idx, const Tensor& weight,
                      const std::vector<ExpertWeights>& experts, float limit, Tensor* out) override {
    RoutedExperts(x, idx, weight, experts, limit, out, /*accumulate=*/false);
  }
  void RoutedExperts(const Tensor& x, const Tensor& idx, const Tensor& weight, const std::vector<ExpertWeights>& experts,
                     float limit, Tensor* out, bool accumulate) {
    const ProfileScope ps = Profile("MoeExperts");
    Use();
    const int64_t fused_before = counters_.fused_moe;
    moe_.Run(x, idx, weight, experts, limit, out, accumulate, *this);
    // The fused kernel reads the experts the rows chose (known on the device: counted from the ids after
    // the op); the per-expert path's Linear calls count their own bytes.
    if (ps.on() && counters_.fused_moe != fused_before && !experts.empty()) {
      const ExpertWeights& e = experts.front();  // the fused kernel takes one K and shape for every expert
      ps.Bytes(op_bytes::MoeExpertsActivations(x.shape[0], RowWidth(x), static_cast<int>(RowWidth(idx))));
      profiler_->AddDistinctIdBytes(I32(idx), idx.numel(), WeightBytes(e.w1) + WeightBytes(e.w3) + WeightBytes(e.w2));
    }
  }

  void SharedExpert(const Tensor& x, const ExpertWeights& expert, float limit, Tensor* out) override {
    const ProfileScope ps = Profile("SharedExpert");
    const int64_t m = x.shape[0], D = RowWidth(x), I = expert.w1.out;
    ps.Bytes(op_bytes::SwiGlu(m * I) + op_bytes::Add(m * D));  // the linears count theirs
    Use();
    if (exl3_.SharedExpertRows(x, expert, limit, out)) {
      if (ps.on()) ps.Bytes(LinearBytes(m, expert.w1) + LinearBytes(m, expert.w3) + LinearBytes(m, expert.w2));
      return;
    }
    Tensor g = arena_.Temp(DType::kF32, {m, I}), u = arena_.Temp(DType::kF32, {m, I}), y = arena_.Temp(DType::kF32, {m, D});
    LinearBatch({{&x, &expert.w1, &g}, {&x, &expert.w3, &u}});
    cuda_ops::SwiGlu(F(g), F(u), m * I, limit, ctx_->stream);
    Linear(g, expert.w2, &y);
    cuda_ops::Add(F(y), m * D, F(*out), ctx_->stream);
    CheckLaunch("SharedExpert");
  }

  // ---- sampling (sampling_ops.h): only the tokens and the asked-for logprobs come back ----
  std::vector<SampledRow> SampleRows(const Tensor& logits, const std::vector<RowSampling>& rows) override {
    const ProfileScope ps = Profile("SampleRows");
    const int64_t n = static_cast<int64_t>(rows.size()), vocab = RowWidth(logits);
    Require(logits.dtype == DType::kF32 && logits.shape[0] == n, "SampleRows", "logits must be f32 [rows, vocab]");
    Require(vocab < (int64_t{1} << 31), "SampleRows", "vocabulary too large for 32-bit token ids");
    if (n == 0) return {};
    ps.Bytes(static_cast<double>(logits.nbytes()));
    Use();
    if (arena_.capturing()) throw std::runtime_error("SampleRows inside a graph segment (its results go to the host)");
    const Tensor dout = LaunchSampleRows(logits, rows, arena_, ctx_->stream);
    std::vector<cuda_ops::SampleRowOut> host(n);
    ToHost(dout, host.data());
    return SampledRowsOf(host, rows, vocab);
  }

  void ArgmaxRows(const Tensor& logits, Tensor* ids) override {
    const ProfileScope ps = Profile("ArgmaxRows");
    const int64_t rows = logits.shape.at(0), vocab = RowWidth(logits);
    Require(logits.dtype == DType::kF32, "ArgmaxRows", "logits must be f32 [rows, vocab]");
    Require(ids->dtype == DType::kI32 && ids->numel() == rows, "ArgmaxRows", "ids must be i32 [rows]");
    Require(vocab < (int64_t{1} << 31), "ArgmaxRows", "vocabulary too large for 32-bit token ids");
    ps.Bytes(static_cast<double>(logits.nbytes()));
    Use();
    cuda_ops::ArgmaxRows(F(logits), rows, vocab, static_cast<int32_t*>(ids->data), ctx_->stream);
    CheckLaunch("ArgmaxRows");
  }

  // The stream every op runs on (CudaBackendStream).
  cudaStream_t stream() const { return ctx_->stream; }
  // What this backend did (CudaBackendStats).
  CudaBackendStatistics statistics() const { return counters_.Snapshot(); }

 private:
  void Use() const { ctx_->Use(); }

  // y = x W (dense or EXL3).
  void LinearOn(const Tensor& x, const LinearWeight& w, Tensor* out) {
    const int64_t m = x.shape[0];
    const cudaStream_t stream = ctx_->stream;
    if (w.is_exl3()) {
      CudaExl3Linear& e = Exl3Weights::Of(w);
      exl3_.Apply(exl3_.PartFor(e, e.slice.out_begin, e.slice.out_end), F(x), w.in, m, F(*out), w.out, false);
      return;
    }
    const cuda_ops::WType type = WTypeOf(w.dense.dtype, w.name);
    if (m > kGraphMaxRows && !w.bias.data && DenseGemm::Takes(type, w.out, w.in)) {
      const Tensor wf = arena_.Temp(DType::kF32, {w.out, w.in});
      dense_gemm_.Run(F(x), w.in, m, w.dense.data, type, w.out, w.in, F(wf), F(*out), w.out, stream);
      CheckLaunch("Linear (cuBLAS)");
      return;
    }
    cuda_ops::DenseLinear(F(x), w.in, m, w.dense.data, type, w.in, w.out, w.in, w.bias.data ? F(w.bias) : nullptr,
                          F(*out), w.out, stream);
    CheckLaunch("Linear");
  }

  // Brackets an op for the profiler (a no-op unless profiling is on and a step is open), and takes the
  // bytes the op moves (kernels/op_bytes.h).
  struct ProfileScope {
    OpProfiler* profiler;
    ~ProfileScope() {
      if (profiler) profiler->End();
    }
    bool on() const { return profiler != nullptr; }
    void Bytes(double bytes) const {
      if (profiler) profiler->AddBytes(bytes);
    }
  };
  double WeightBytes(const LinearWeight& w, int groups = 1) { return HeldWeightBytes(exl3_, w, groups); }
  double LinearBytes(int64_t m, const LinearWeight& w) { return HeldLinearBytes(exl3_, m, w); }
  // Ops whose launches take their parameters by value call Profile: inside a stateful segment that is
  // recorded they cannot run (Unrecordable). Ops that stage their parameters call ProfileStaged.
  ProfileScope Profile(const std::string& op) { return Profile(op.c_str()); }
  ProfileScope Profile(const char* op) {
    if (arena_.mode() != StatefulMode::kNone && !arena_.plain_ops())
      arena_.Unrecordable(op, "launch parameters not staged");
    return ProfileStaged(op);
  }
  ProfileScope ProfileStaged(const char* op) {
    if (!profiler_ || !arena_.in_step()) return {nullptr};
    profiler_->Begin(std::string(op));
    return {profiler_.get()};
  }
  std::string LinearProfileName(const char* op, const LinearWeight& w) const {
    if (!profiler_ || !arena_.in_step()) return {};
    std::string name = op + LinearOpName(w.name);
    if (w.is_exl3()) return name + " [exl3 K" + std::to_string(Exl3Weights::Of(w).weight.K) + "]";
    return name + " [" + DTypeName(w.dense.dtype) + "]";
  }

  // A step of several sequences that one launch cannot hold (a prefill chunk beside decodes, or more
  // sequences than the kernel takes) runs them one by one: counted, and logged once per op.
  void PerSequenceFallback(const char* op, int64_t rows, size_t seqs, int max_rows, int max_seqs) {
    ++counters_.per_sequence_fallbacks;
    if (!logged_fallback_.insert(op).second) return;
    std::fprintf(stderr, "[cuda] %s: a step of %lld rows in %zu sequences runs per sequence (one launch holds %d rows "
                         "of %d sequences); counted in CudaBackendStats().per_sequence_fallbacks, logged once\n",
                 op, static_cast<long long>(rows), seqs, max_rows, max_seqs);
  }

  // Runs the EXL3 jobs of at most 16 rows that can share launches as batched GEMVs (Exl3Weights) and
  // returns the jobs it left (other linears, and a job with no partner to share a launch with), in order.
  std::vector<LinearJob> BatchedExl3Gemvs(const std::vector<LinearJob>& jobs) {
    const Exl3Weights::GemvBatchPlan plan = exl3_.PlanGemvBatches(jobs);
    if (!plan.shares_a_launch()) return jobs;  // no two linears to put in one launch
    const ProfileScope ps = Profile("LinearBatch (batched EXL3 GEMV)");
    Use();
    std::vector<LinearJob> left = exl3_.RunGemvBatches(plan);
    if (ps.on()) {  // the jobs it ran: all but those it left
      for (const LinearJob& j : jobs) ps.Bytes(LinearBytes(j.x->shape[0], *j.w));
      for (const LinearJob& j : left) ps.Bytes(-LinearBytes(j.x->shape[0], *j.w));
    }
    return left;
  }

  // Waits for the stream; inside a step the wait counts as the host waiting for the device (CudaStepHostTimes).
  void SynchronizeTimed(const char* what) {
    std::optional<HostTimer> t;
    if (arena_.in_step()) t.emplace(counters_.step_sync_wait_ns);
    CudaCheck(cudaStreamSynchronize(ctx_->stream), what);
  }

  // HcPre's launch, with y's RmsNorm in it when `norm` is given (its weight may be null: no weight).
  struct HcNorm {
    const Tensor* weight;
    float eps;
  };
  void LaunchHcPre(const char* op, const ProfileScope& ps, const Tensor& X, const Tensor& fn, const Tensor& base,
                   const Tensor& scale, int hc, int iters, float eps, float norm_eps, const HcNorm* norm, Tensor* y,
                   Tensor* post, Tensor* comb) {
    Require(hc <= 16, op, "hc_mult above 16");
    const int64_t n = X.shape[0], D = RowWidth(X) / hc;
    Require(fn.shape.size() == 2 && fn.shape[0] == (2 + hc) * hc && fn.shape[1] == hc * D, op, "fn shape");
    Require(y->numel() == n * D && (!norm || !norm->weight || norm->weight->numel() == D), op,
            "y / norm weight shape");
    ps.Bytes(op_bytes::HcPre(n, D, hc) + (norm && norm->weight ? 4.0 * D : 0.0));
    Use();
    const cuda_ops::HcYNorm y_norm{norm && norm->weight ? F(*norm->weight) : nullptr, norm ? norm->eps : 0.0f};
    cuda_ops::HcPre(F(X), n, D, hc, F(fn), F(base), F(scale), iters, eps, norm_eps, F(*y), F(*post), F(*comb),
                    ctx_->stream, norm ? &y_norm : nullptr);
    CheckLaunch(op);
  }

  std::shared_ptr<StreamContext> ctx_;
  CudaBackendOptions options_;
  CudaBackendCounters counters_;
  BackendDevice device_;  // its name and memory line; PDL on the stream (options_.pdl)
  StepArena arena_;  // the step's scratch, metadata and launch parameters
  GraphRecorder recorder_{ctx_, arena_, counters_};  // the graphs of the forward's segments
  Exl3Weights exl3_{ctx_, arena_, counters_, options_.gemv};  // EXL3 linears: parts, GEMV / GEMM, batched GEMVs
  MoeDispatch moe_{ctx_, arena_, exl3_, counters_, options_.prefill_moe, options_.moe};  // routed experts
  std::unique_ptr<OpProfiler> profiler_;  // on while the bench profiles
  std::optional<HostTimer> step_timer_;  // BeginStep .. EndStep (CudaStepHostTimes)
  AttentionPaths attention_{arena_, options_.prefill_attention};  // which kernel one sequence's attention takes
  DenseGemm dense_gemm_;  // cuBLAS for dense linears of more than kGraphMaxRows rows
  std::set<std::string> logged_fallback_;  // ops whose fallback (per sequence, or composed of other ops) was logged
  DeviceTableCache tables_;  // rope and routing tables, uploaded once
};

}  // namespace

std::shared_ptr<Backend> MakeCudaBackend(int device, const CudaBackendOptions& options) {
  RequireCudaDevice(device, "the CUDA backend");
  return std::make_shared<CudaBackend>(device, options);
}

DeviceStream CudaBackendStream(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return DeviceStream{cuda ? static_cast<void*>(cuda->stream()) : nullptr};
}

CudaBackendStatistics CudaBackendStats(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda ? cuda->statistics() : CudaBackendStatistics{};
}

}  // namespace dsmesh

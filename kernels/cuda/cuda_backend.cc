// The CUDA backend (cuda_backend.h): the Backend seam on one device. Small ops are the kernels of
// model_ops.h; EXL3 linears go through exl3_gemv.h (m <= 16) and exl3_gemm.h (larger m); routed
// experts through exl3_moe.h when every expert of the layer suits it and m <= 24, else per expert.
//
// Memory: a step's temporaries (Scratch, and the ops' own) come from a fixed arena, bump-allocated and
// released by mark, so that a step's addresses depend only on its shapes; beyond the arena, and outside
// a step, from the stream-ordered pool (cudaMallocAsync, freed the same way when the last Tensor view
// drops). State and weights come from Alloc (stream-ordered pool) and cudaMalloc. The step's token ids
// and positions are copied once per step (BeginStep) into fixed device buffers that later ops recognise
// by host address; other host metadata is copied per call; rope tables and hash-routing tables are
// uploaded once and cached by their host address.
//
// CUDA graphs: a Segment of a step of at most kGraphMaxRows rows runs eagerly the first time its key is
// seen, is captured the second time and replayed from then on. The stateful part of each block between
// segments (compressors, indexer, attention: StatefulSegment) is recorded the same way, but its host
// logic runs every step: its ops stage their per-step launch parameters (cuda_ops::ParamStager) into the
// record's buffer, one copy uploads them, and the graph replays; their launches have fixed shapes (the
// attention's key ranges, the indexer's key bucket, the compressor's windows per sequence). Only the
// collectives stay eager. A capture that fails is logged once per key and the segment runs eagerly.
// CudaGraphCallCounts() counts each outcome.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense_gemm.h"
#include "kernels/cuda/exl3_device_weights.h"
#include "kernels/cuda/exl3_gemm.h"
#include "kernels/cuda/exl3_gemv.h"
#include "kernels/cuda/exl3_moe.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/op_profiler.h"
#include "kernels/cuda/sampling_ops.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/kv_rows.h"

namespace dsmesh {
namespace {

std::atomic<int64_t> g_fused_moe{0}, g_per_expert_moe{0}, g_per_sequence_fallbacks{0};
std::atomic<int64_t> g_gemv_batches{0}, g_gemv_batched_linears{0};

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}
std::atomic<int64_t> g_graph_captures{0}, g_graph_replays{0}, g_graph_failures{0}, g_eager_segments{0},
    g_scratch_overflows{0}, g_stateful_captures{0}, g_stateful_replays{0}, g_stateful_failures{0},
    g_replayed_nodes{0};

// Steps of more rows than this (prefill chunks) run their segments eagerly: decode buckets are 1..4
// sequences x 1..4 rows.
constexpr int64_t kGraphMaxRows = 16;
// Rows whose metadata the fixed step buffers hold (bigger steps copy theirs into scratch).
constexpr int64_t kStepBufferRows = 64;
constexpr size_t kScratchAlign = 256;

int64_t RowWidth(const Tensor& t) { return t.shape.empty() || t.shape[0] == 0 ? 0 : t.numel() / t.shape[0]; }
float* F(const Tensor& t) { return static_cast<float*>(t.data); }
const int32_t* I32(const Tensor& t) { return static_cast<const int32_t*>(t.data); }

void Require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::runtime_error(std::string("cuda backend ") + op + ": " + what);
}

// How a state pool tensor stores its rows (kernels/kv_rows.h): U8 tensors hold the fp8 layout.
cuda_ops::RowKind RowKindOf(DType t) {
  switch (t) {
    case DType::kF32: return cuda_ops::RowKind::kF32;
    case DType::kBF16: return cuda_ops::RowKind::kBF16;
    case DType::kU8: return cuda_ops::RowKind::kFp8;
    default: throw std::runtime_error(std::string("cuda backend: state rows of dtype ") + DTypeName(t) + " (expected F32, BF16 or U8)");
  }
}

cuda_ops::WType WTypeOf(DType t, const std::string& what) {
  switch (t) {
    case DType::kF32: return cuda_ops::WType::kF32;
    case DType::kBF16: return cuda_ops::WType::kBF16;
    case DType::kF16: return cuda_ops::WType::kF16;
    default: throw std::runtime_error("cuda backend: " + what + " has dtype " + DTypeName(t) + ", expected f32/bf16/f16");
  }
}

// The stream every op of one backend runs on; shared with the deleters of the tensors it allocated so
// that a tensor outliving the backend still frees on a live stream.
struct StreamContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  explicit StreamContext(int d) : device(d) {
    CudaCheck(cudaSetDevice(d), "cudaSetDevice(" + std::to_string(d) + ")");
    CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~StreamContext() {
    cudaSetDevice(device);
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
};

// A slice of an EXL3 linear as its own device linear: the Hadamard blocks the slice touches
// ([k0, k1) x [n0, n1), multiples of 128), with the slice's offsets inside them.
struct Exl3Part {
  std::unique_ptr<Exl3DeviceLinearBuffers> buffers;
  int64_t x_col0 = 0, kin = 0;   // input columns of the slice inside the block range
  int64_t y_col0 = 0, nout = 0;  // output columns of the slice inside the block range
  Tensor bias;                   // f32 [nout] device, or empty
};

// The checkpoint's EXL3 tensors (host views) or a synthetic linear's seed, and the slice this rank uses;
// device parts are built on first use and are the only device copy (the MoE kernel's pointer tables
// point into them).
struct CudaExl3Linear {
  Exl3Weight weight;  // synthetic: sizes, K, codebook and name only (no host tensors)
  Exl3Slice slice;
  bool synthetic = false;
  uint64_t seed = 0;
  std::mutex mu;
  std::unique_ptr<Exl3Part> whole;
  std::map<int64_t, std::unique_ptr<Exl3Part>> groups;  // GroupedLinear: out_begin -> part
};

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

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& options)
      : ctx_(std::make_shared<StreamContext>(device)), options_(options) {
    cudaDeviceProp prop{};
    CudaCheck(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    name_ = "cuda:" + std::to_string(device) + " (" + prop.name + ")";
    arena_bytes_ = options.scratch_bytes / kScratchAlign * kScratchAlign;
    if (arena_bytes_ > 0)
      CudaCheck(cudaMalloc(&arena_, arena_bytes_), "cudaMalloc of the " + std::to_string(arena_bytes_ >> 20) +
                                                       " MiB scratch arena");
    CudaCheck(cudaMalloc(&step_tokens_dev_, kStepBufferRows * sizeof(int32_t)), "cudaMalloc for step tokens");
    CudaCheck(cudaMalloc(&step_positions_dev_, kStepBufferRows * sizeof(int64_t)), "cudaMalloc for step positions");
    CudaCheck(cudaMallocHost(&step_pinned_, kStepBufferRows * (sizeof(int32_t) + sizeof(int64_t))),
              "cudaMallocHost for step metadata");
    CudaCheck(cudaEventCreateWithFlags(&step_uploaded_, cudaEventDisableTiming), "cudaEventCreate");
    // A/B knobs for prefill chunks (more rows than a decode bucket): the older MoE paths (per expert with
    // the routing on the host, or the single-launch kernel on slices of rows) instead of slices of pairs
    // sorted by expert; attention split over keys in slices of 16 rows (`split`, the decode kernel) or one
    // block per (row, head) (`per-row`) instead of the tensor-core kernel.
    prefill_moe_per_expert_ = EnvIs("DSMESH_CUDA_PREFILL_MOE", "per-expert");
    prefill_moe_row_slices_ = EnvIs("DSMESH_CUDA_PREFILL_MOE", "row-slices");
    // `mma-fp16` keeps the tensor-core kernel but rounds its operands to fp16 once (a third of the mma).
    prefill_attention_ = EnvIs("DSMESH_CUDA_PREFILL_ATTENTION", "per-row")    ? PrefillAttention::kPerRow
                         : EnvIs("DSMESH_CUDA_PREFILL_ATTENTION", "split")    ? PrefillAttention::kSplit
                         : EnvIs("DSMESH_CUDA_PREFILL_ATTENTION", "mma-fp16") ? PrefillAttention::kMmaFp16
                                                                              : PrefillAttention::kMma;
    if (prefill_moe_per_expert_ || prefill_moe_row_slices_ || prefill_attention_ != PrefillAttention::kMma)
      std::fprintf(stderr, "[cuda] prefill chunks:%s%s%s (environment)\n",
                   prefill_moe_per_expert_ ? " routed experts per expert" : "",
                   prefill_moe_row_slices_ ? " routed experts on slices of rows" : "",
                   prefill_attention_ == PrefillAttention::kPerRow    ? " attention one block per (row, head)"
                   : prefill_attention_ == PrefillAttention::kSplit   ? " attention split over keys (16-row slices)"
                   : prefill_attention_ == PrefillAttention::kMmaFp16 ? " attention on tensor cores with fp16 operands"
                                                                      : "");
    // A/B knob: the stateful part of decode steps eager between the graph segments, as before it was recorded.
    stateful_graphs_on_ = !EnvIs("DSMESH_CUDA_STATEFUL_GRAPHS", "off");
    if (!stateful_graphs_on_) std::fprintf(stderr, "[cuda] stateful segments run eagerly (environment)\n");
  }

  ~CudaBackend() override {
    Use();
    cudaStreamSynchronize(ctx_->stream);
    for (auto& [k, g] : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    for (auto& [k, g] : stateful_graphs_) {
      if (g.exec) cudaGraphExecDestroy(g.exec);
      if (g.uploaded) cudaEventDestroy(g.uploaded);
      cudaFreeHost(g.params_host);
      cudaFree(g.params_dev);
    }
    cudaFreeHost(eager_params_host_);
    cudaFree(eager_params_dev_);
    for (auto& [k, c] : host_cache_) cudaFree(c.device);
    for (SideStream& sd : side_) {
      sd.gemv_ws.reset();
      cudaStreamDestroy(sd.stream);
      cudaEventDestroy(sd.done);
    }
    if (fork_) cudaEventDestroy(fork_);
    cudaFree(arena_);
    cudaFree(step_tables_dev_);
    cudaFreeHost(step_tables_pinned_);
    cudaFree(step_tokens_dev_);
    cudaFree(step_positions_dev_);
    cudaFreeHost(step_pinned_);
    cudaEventDestroy(step_uploaded_);
  }

  std::string name() const override { return name_; }
  bool host_memory() const override { return false; }

  // ---- memory ----
  Tensor Alloc(DType dtype, std::vector<int64_t> shape) override {
    Use();
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    const size_t bytes = std::max<size_t>(t.nbytes(), 16);
    void* p = nullptr;
    CudaCheck(cudaMallocAsync(&p, bytes, ctx_->stream), "cudaMallocAsync of " + std::to_string(bytes) + " bytes");
    CudaCheck(cudaMemsetAsync(p, 0, bytes, ctx_->stream), "cudaMemsetAsync");
    auto ctx = ctx_;
    t.data = p;
    t.owner = std::shared_ptr<void>(p, [ctx](void* q) {
      cudaSetDevice(ctx->device);
      cudaFreeAsync(q, ctx->stream);
    });
    return t;
  }

  void Zero(Tensor* t) override {
    const ProfileScope ps = Profile("Zero");
    Use();
    if (t->nbytes() > 0) CudaCheck(cudaMemsetAsync(t->data, 0, t->nbytes(), ctx_->stream), "Zero");
  }

  // ---- step scope ----
  void BeginStep(const StepMetadata& step) override {
    const int32_t* tokens = step.tokens;
    const int64_t* positions = step.positions;
    const int64_t n = step.n;
    Use();
    Require(!capturing_, "BeginStep", "called inside a graph segment");
    in_step_ = true;
    arena_top_ = 0;
    if (profiler_) profiler_->BeginStep();
    UploadTables(step.tables, step.tables_len);
    step_tokens_ = tokens;
    step_positions_ = positions;
    step_n_ = n;
    int64_t most = 0;
    for (int64_t i = 0; i < n; ++i) most = std::max(most, positions[i] + 1);
    step_key_bucket_ = 1024;
    while (step_key_bucket_ < most) step_key_bucket_ *= 2;
    if (n <= kStepBufferRows) {
      // The pinned copy is reused: wait for the previous step's upload to have read it.
      CudaCheck(cudaEventSynchronize(step_uploaded_), "step metadata upload");
      auto* pt = static_cast<int32_t*>(step_pinned_);
      auto* pp = reinterpret_cast<int64_t*>(static_cast<char*>(step_pinned_) + kStepBufferRows * sizeof(int32_t));
      std::memcpy(pt, tokens, static_cast<size_t>(n) * sizeof(int32_t));
      std::memcpy(pp, positions, static_cast<size_t>(n) * sizeof(int64_t));
      CudaCheck(cudaMemcpyAsync(step_tokens_dev_, pt, n * sizeof(int32_t), cudaMemcpyHostToDevice, ctx_->stream),
                "step tokens upload");
      CudaCheck(cudaMemcpyAsync(step_positions_dev_, pp, n * sizeof(int64_t), cudaMemcpyHostToDevice, ctx_->stream),
                "step positions upload");
      CudaCheck(cudaEventRecord(step_uploaded_, ctx_->stream), "cudaEventRecord");
      step_tokens_on_device_ = static_cast<int32_t*>(step_tokens_dev_);
      step_positions_on_device_ = static_cast<int64_t*>(step_positions_dev_);
    } else {
      Tensor t = Staged(tokens, n), p = Staged(positions, n);
      step_tokens_on_device_ = static_cast<int32_t*>(t.data);
      step_positions_on_device_ = static_cast<int64_t*>(p.data);
      step_meta_keep_ = {t, p};
    }
  }

  void EndStep() override {
    if (profiler_) profiler_->EndStep();
    in_step_ = false;
    arena_top_ = 0;
    step_tables_ = nullptr;
    step_tables_len_ = 0;
    step_tokens_ = nullptr;
    step_positions_ = nullptr;
    step_n_ = 0;
    step_meta_keep_.clear();
  }

  Tensor Scratch(DType dtype, std::vector<int64_t> shape) override { return Temp(dtype, std::move(shape)); }
  size_t ScratchMark() override { return arena_top_; }
  void ReleaseScratch(size_t mark) override {
    Require(mark <= arena_top_, "ReleaseScratch", "mark above the arena's top");
    arena_top_ = mark;
  }

  void Segment(const SegmentKey& key, const std::function<void()>& ops) override {
    if (!options_.cuda_graphs || profiler_ || !in_step_ || key.rows > kGraphMaxRows || step_n_ > kGraphMaxRows) {
      ++g_eager_segments;
      ops();
      return;
    }
    auto [it, first_time] = graphs_.try_emplace(key);
    Graph& g = it->second;
    if (first_time || g.failed) {  // first sight: eager, which also builds what the ops create lazily
      ++g_eager_segments;
      ops();
      return;
    }
    if (g.exec) {
      if (arena_top_ != g.scratch_begin)
        throw std::runtime_error("cuda backend: graph segment (site " + std::to_string(key.site) + ", layer " +
                                 std::to_string(key.layer) + ", rows " + std::to_string(key.rows) +
                                 ") replayed at scratch offset " + std::to_string(arena_top_) + ", captured at " +
                                 std::to_string(g.scratch_begin));
      Use();
      CudaCheck(cudaGraphLaunch(g.exec, ctx_->stream), "cudaGraphLaunch");
      arena_top_ = g.scratch_end;
      ++g_graph_replays;
      g_replayed_nodes += g.nodes;
      return;
    }
    Capture(key, &g, ops);
  }

  // The stateful part of a block: recorded like a Segment (first sight eager, second captured, then
  // replayed), but `ops` runs every time: when replaying, its ops only compute and stage their parameters
  // (each launch's parameter block, cuda_ops::ParamStager) into the record's own buffer, which one copy
  // uploads before the graph launches. The record's key adds the step's key bucket (the indexer's launch
  // covers bucket / ratio keys; IndexerKeysLd).
  void StatefulSegment(const SegmentKey& key, const std::function<void()>& ops) override {
    if (!options_.cuda_graphs || !stateful_graphs_on_ || profiler_ || !in_step_ || key.rows > kGraphMaxRows ||
        step_n_ > kGraphMaxRows || capturing_) {
      ops();
      return;
    }
    auto [it, first_time] = stateful_graphs_.try_emplace(std::make_pair(key, step_key_bucket_));
    StatefulGraph& g = it->second;
    if (g.failed) {
      ++g_eager_segments;
      ops();
      return;
    }
    if (first_time) {  // eager, noting whether every op could be recorded
      ++g_eager_segments;
      unrecordable_.clear();
      stateful_mode_ = StatefulMode::kProbing;
      try {
        ops();
      } catch (...) {
        stateful_mode_ = StatefulMode::kNone;
        throw;
      }
      stateful_mode_ = StatefulMode::kNone;
      if (!unrecordable_.empty()) {
        g.failed = true;
        ++g_graph_failures;
        ++g_stateful_failures;
        if (!logged_stateful_failure_)
          std::fprintf(stderr, "[cuda] the stateful segment of layer %d (%lld rows) runs eagerly: %s (counted in "
                               "CudaGraphCallCounts().failures; logged once)\n",
                       key.layer, static_cast<long long>(key.rows), unrecordable_.c_str());
        logged_stateful_failure_ = true;
      }
      return;
    }
    if (!g.exec) {
      CaptureStateful(key, &g, ops);
      return;
    }
    if (arena_top_ != g.scratch_begin)
      throw std::runtime_error("cuda backend: stateful segment (layer " + std::to_string(key.layer) + ", rows " +
                               std::to_string(key.rows) + ") replayed at scratch offset " + std::to_string(arena_top_) +
                               ", captured at " + std::to_string(g.scratch_begin));
    Use();
    CudaCheck(cudaEventSynchronize(g.uploaded), "stateful segment parameters");  // the last upload read them
    {
      StagingInto into(this, &g, StatefulMode::kReplaying);
      ops();
    }
    if (g.params_used != g.params_captured || arena_top_ != g.scratch_end || g.shapes_seen != g.shapes.size())
      throw std::runtime_error("cuda backend: stateful segment (layer " + std::to_string(key.layer) + ", rows " +
                               std::to_string(key.rows) + ") staged " + std::to_string(g.params_used) +
                               " parameter bytes and ended at scratch " + std::to_string(arena_top_) +
                               "; its record has " + std::to_string(g.params_captured) + " and " +
                               std::to_string(g.scratch_end));
    LaunchStateful(&g);
    ++g_graph_replays;
    ++g_stateful_replays;
    g_replayed_nodes += g.nodes;
  }

  void SetOpProfiling(OpProfiling mode) override {
    Use();
    profiler_.reset();
    if (mode != OpProfiling::kOff)
      profiler_ = std::make_unique<OpProfiler>(ctx_->stream, mode == OpProfiling::kDeviceOnly);
  }
  std::string MemoryDescription() const override {
    Use();
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return "device memory: unknown (cudaMemGetInfo failed)";
    }
    char line[160];
    std::snprintf(line, sizeof(line), "device memory: %.2f GiB used of %.2f GiB (%s)", (total - free) / 1073741824.0,
                  total / 1073741824.0, name_.c_str());
    return line;
  }

  OpProfile TakeOpProfile() override { return profiler_ ? profiler_->Take() : OpProfile{}; }
  void BeginPhase(const char* phase) override {
    if (profiler_) profiler_->BeginPhase(phase);
  }
  void EndPhase() override {
    if (profiler_) profiler_->EndPhase();
  }

  Tensor Upload(const Tensor& host) override {
    Use();
    Tensor t = host;
    const size_t bytes = std::max<size_t>(host.nbytes(), 16);
    void* p = nullptr;
    CudaCheck(cudaMalloc(&p, bytes), "cudaMalloc of " + std::to_string(bytes) + " bytes for a weight " +
                                         host.ShapeString());
    if (host.nbytes() > 0) CudaCheck(cudaMemcpy(p, host.data, host.nbytes(), cudaMemcpyHostToDevice), "weight upload");
    const int device = ctx_->device;
    t.data = p;
    t.owner = std::shared_ptr<void>(p, [device](void* q) {
      cudaSetDevice(device);
      cudaFree(q);
    });
    return t;
  }

  void ToHost(const Tensor& src, void* dst) override {
    const ProfileScope ps = Profile("ToHost");
    Use();
    // A copy to the host cannot be part of a graph: refuse before the stream sees it, so that the
    // capture ends cleanly and the segment runs eagerly (Capture counts the failure).
    if (capturing_) throw std::runtime_error("ToHost inside a graph segment (the op needs its result on the host)");
    if (src.nbytes() > 0)
      CudaCheck(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, ctx_->stream), "ToHost copy");
    CudaCheck(cudaStreamSynchronize(ctx_->stream), "ToHost (an earlier kernel of this step failed)");
  }

  void FromHost(const void* src, Tensor* dst) override {
    const ProfileScope ps = Profile("FromHost");
    Use();
    if (dst->nbytes() > 0)
      CudaCheck(cudaMemcpyAsync(dst->data, src, dst->nbytes(), cudaMemcpyHostToDevice, ctx_->stream), "FromHost copy");
    CudaCheck(cudaStreamSynchronize(ctx_->stream), "FromHost");
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
    }
    const int most = cuda_ops::CopyBytesBatchMax();
    for (size_t i = 0; i < bytes.size(); i += most)
      cuda_ops::CopyBytesBatch(bytes.data() + i, static_cast<int>(std::min<size_t>(most, bytes.size() - i)), ctx_->stream);
    Launched("CopyRowsBatch");
  }

  void CopyRows(const Tensor& src, int64_t src_row, Tensor* dst, int64_t dst_row, int64_t rows) override {
    const ProfileScope ps = Profile("CopyRows");
    if (rows <= 0) return;
    Use();
    const int64_t row_bytes = RowWidth(src) * static_cast<int64_t>(DTypeSize(src.dtype));
    Require(row_bytes == RowWidth(*dst) * static_cast<int64_t>(DTypeSize(dst->dtype)), "CopyRows", "row sizes differ");
    Require(src_row + rows <= src.shape[0] && dst_row + rows <= dst->shape[0], "CopyRows", "rows out of range");
    cuda_ops::CopyRows(src.data, src_row, dst->data, dst_row, rows, row_bytes, ctx_->stream);
    Launched("CopyRows");
  }

  LinearWeight LoadExl3Linear(const Checkpoint& ckpt, const std::string& prefix, int64_t out_features,
                              int64_t in_features, int64_t out_begin, int64_t out_end, int64_t in_begin,
                              int64_t in_end) override {
    auto e = std::make_shared<CudaExl3Linear>();
    e->weight = LoadExl3Weight(ckpt, prefix, in_features, out_features);
    e->slice = {in_begin, in_end, out_begin, out_end, in_begin == 0};  // input-sliced ranks: only the first adds the bias
    NoteExl3Slice(e->slice);
    return Exl3LinearWeight(prefix, out_begin, out_end, in_begin, in_end, e);
  }

  LinearWeight SyntheticExl3Linear(const std::string& name, int64_t out_features, int64_t in_features,
                                   int64_t out_begin, int64_t out_end, int64_t in_begin, int64_t in_end, int K,
                                   uint64_t seed) override {
    auto e = std::make_shared<CudaExl3Linear>();
    e->synthetic = true;
    e->seed = seed;
    e->weight.name = name;
    e->weight.K = K;
    e->weight.codebook = Exl3Codebook::kMcg;
    e->weight.in_features = in_features;
    e->weight.out_features = out_features;
    e->slice = {in_begin, in_end, out_begin, out_end, in_begin == 0};
    Use();
    PartFor(*e, out_begin, out_end);  // generate now: loading is where the time and memory go
    NoteExl3Slice(e->slice);
    return Exl3LinearWeight(name, out_begin, out_end, in_begin, in_end, e);
  }

  // ---- elementwise and normalisation ----
  void Embedding(const Tensor& table, const int32_t* tokens, int64_t n, Tensor* out) override {
    const ProfileScope ps = Profile("Embedding");
    const int64_t D = table.shape[1];
    Require(out->shape[0] == n && RowWidth(*out) == D, "Embedding", "output shape");
    for (int64_t i = 0; i < n; ++i)
      Require(tokens[i] >= 0 && tokens[i] < table.shape[0], "Embedding", "token id out of range");
    Tensor ids;
    const int32_t* dev = StepTokens(tokens, n, &ids);
    cuda_ops::Embedding(table.data, WTypeOf(table.dtype, "the embedding"), D, dev, n, F(*out), ctx_->stream);
    Launched("Embedding");
  }

  void RmsNorm(const Tensor& x, int64_t dim, const Tensor* weight, float eps, Tensor* out) override {
    const ProfileScope ps = Profile("RmsNorm");
    const int64_t groups = x.numel() / dim;
    Require(groups * dim == x.numel() && out->numel() == x.numel(), "RmsNorm", "shape");
    Use();
    cuda_ops::RmsNorm(F(x), groups, dim, weight ? F(*weight) : nullptr, eps, F(*out), ctx_->stream);
    Launched("RmsNorm");
  }

  void Add(const Tensor& a, Tensor* acc) override {
    const ProfileScope ps = Profile("Add");
    Require(a.numel() == acc->numel(), "Add", "sizes differ");
    Use();
    cuda_ops::Add(F(a), a.numel(), F(*acc), ctx_->stream);
    Launched("Add");
  }

  void Scale(Tensor* x, float s) override {
    const ProfileScope ps = Profile("Scale");
    Use();
    cuda_ops::Scale(F(*x), x->numel(), s, ctx_->stream);
    Launched("Scale");
  }

  // ---- linear ----
  void Linear(const Tensor& x, const LinearWeight& w, Tensor* out) override {
    const ProfileScope ps = Profile(LinearProfileName("Linear ", w));
    const int64_t m = x.shape[0];
    Require(RowWidth(x) == w.in, "Linear", w.name + ": input width " + std::to_string(RowWidth(x)) + " != " + std::to_string(w.in));
    Require(RowWidth(*out) == w.out && out->shape[0] == m, "Linear", w.name + ": output shape");
    Use();
    LinearOn(x, w, out, ctx_->stream, MainGemvWorkspace());
  }

  void LinearBatch(const std::vector<LinearJob>& jobs) override {
    for (const LinearJob& j : jobs)
      Require(RowWidth(*j.x) == j.w->in && RowWidth(*j.out) == j.w->out && j.out->shape[0] == j.x->shape[0],
              "LinearBatch", j.w->name + ": shape");
    const std::vector<LinearJob> rest = jobs.size() > 1 ? BatchedExl3Gemvs(jobs) : jobs;
    bool concurrent = rest.size() > 1 && ConcurrencyAllowed();
    for (const LinearJob& j : rest) concurrent = concurrent && j.x->shape[0] <= kExl3GemvMaxRows;
    if (!concurrent) {
      for (const LinearJob& j : rest) Linear(*j.x, *j.w, j.out);
      return;
    }
    const ProfileScope ps = Profile("LinearBatch");
    Use();
    Concurrently(static_cast<int>(rest.size()), [&](int i, cudaStream_t stream, Exl3GemvWorkspace& ws) {
      LinearOn(*rest[i].x, *rest[i].w, rest[i].out, stream, ws);
    });
  }

  void GroupedLinear(const Tensor& x, const LinearWeight& w, int groups, Tensor* out) override {
    const ProfileScope ps = Profile(LinearProfileName("GroupedLinear ", w));
    const int64_t m = x.shape[0], out_g = w.out / groups;
    Require(RowWidth(x) == groups * w.in && RowWidth(*out) == w.out && w.out % groups == 0, "GroupedLinear",
            w.name + ": shape");
    Use();
    if (w.is_exl3() && m <= kExl3GemvMaxRows && GroupedExl3Rows(x, w, groups, out)) return;
    for (int g = 0; g < groups; ++g) {
      if (w.is_exl3()) {
        auto& e = *static_cast<CudaExl3Linear*>(w.exl3.get());
        const int64_t o0 = e.slice.out_begin + g * out_g;
        Exl3Apply(PartFor(e, o0, o0 + out_g), F(x) + g * w.in, groups * w.in, m, F(*out) + g * out_g, w.out, false);
        continue;
      }
      const size_t es = DTypeSize(w.dense.dtype);
      const void* wg = static_cast<const char*>(w.dense.data) + static_cast<size_t>(g) * out_g * w.in * es;
      const cuda_ops::WType type = WTypeOf(w.dense.dtype, w.name);
      if (m > kGraphMaxRows && DenseGemm::Takes(type, out_g, w.in)) {
        const Tensor wf = Temp(DType::kF32, {out_g, w.in});
        dense_gemm_.Run(F(x) + g * w.in, groups * w.in, m, wg, type, out_g, w.in, F(wf), F(*out) + g * out_g, w.out,
                        ctx_->stream);
        continue;
      }
      cuda_ops::DenseLinear(F(x) + g * w.in, groups * w.in, m, wg, type, w.in, out_g, w.in, nullptr,
                            F(*out) + g * out_g, w.out, ctx_->stream);
      Launched("GroupedLinear");
    }
  }

  // ---- rope ----
  void Rope(Tensor* x, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
            const std::vector<float>& inv_freq, bool inverse) override {
    const ProfileScope ps = Profile("Rope");
    const int64_t n = x->shape[0];
    Require(RowWidth(*x) == heads * head_dim && static_cast<int64_t>(inv_freq.size()) == rope_dim / 2, "Rope", "shape");
    Tensor pos;
    const int64_t* dev = StepPositions(positions, n, &pos);
    cuda_ops::Rope(F(*x), n, heads, head_dim, rope_dim, dev, Cached(inv_freq), inverse, ctx_->stream);
    Launched("Rope");
  }

  // ---- hyper-connections ----
  void HcPre(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc, int iters, float eps,
             float norm_eps, Tensor* y, Tensor* post, Tensor* comb) override {
    const ProfileScope ps = Profile("HcPre");
    Require(hc <= 16, "HcPre", "hc_mult above 16");
    const int64_t n = X.shape[0], D = RowWidth(X) / hc;
    Require(fn.shape.size() == 2 && fn.shape[0] == (2 + hc) * hc && fn.shape[1] == hc * D, "HcPre", "fn shape");
    Use();
    Tensor mixes = Temp(DType::kF32, {cuda_ops::HcPreScratchFloats(n, D, hc)});
    cuda_ops::HcPre(F(X), n, D, hc, F(fn), F(base), F(scale), iters, eps, norm_eps, F(mixes), F(*y), F(*post), F(*comb),
                    ctx_->stream);
    Launched("HcPre");
  }

  void HcExpand(const Tensor& h, int hc, Tensor* X) override {
    const ProfileScope ps = Profile("HcExpand");
    Use();
    cuda_ops::HcExpand(F(h), h.shape[0], RowWidth(h), hc, F(*X), ctx_->stream);
    Launched("HcExpand");
  }

  void HcPost(const Tensor& X, const Tensor& f, const Tensor& post, const Tensor& comb, int hc, Tensor* out) override {
    const ProfileScope ps = Profile("HcPost");
    Use();
    cuda_ops::HcPost(F(X), F(f), F(post), F(comb), X.shape[0], RowWidth(f), hc, F(*out), ctx_->stream);
    Launched("HcPost");
  }

  void HcHead(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc, float eps,
              float norm_eps, Tensor* y) override {
    const ProfileScope ps = Profile("HcHead");
    Require(hc <= 16, "HcHead", "hc_mult above 16");
    const int64_t n = X.shape[0], D = RowWidth(X) / hc;
    Require(fn.shape.size() == 2 && fn.shape[0] == hc && fn.shape[1] == hc * D, "HcHead", "fn shape");
    Use();
    Tensor mixes = Temp(DType::kF32, {n, static_cast<int64_t>(hc)});
    cuda_ops::HcHead(F(X), n, D, hc, F(fn), F(base), F(scale), eps, norm_eps, F(mixes), F(*y), ctx_->stream);
    Launched("HcHead");
  }

  // ---- compressor ----
  void AddPositionBias(Tensor* score, const Tensor& ape, const int64_t* positions, int ratio) override {
    const ProfileScope ps = ProfileStaged("AddPositionBias");
    const int64_t w = RowWidth(*score), n = score->shape[0];
    Require(RowWidth(ape) == w && ape.shape[0] == ratio, "AddPositionBias", "ape shape");
    Use();
    Tensor pos;
    const int64_t* dev = StepPositions(positions, n, &pos);
    if (stateful_mode_ == StatefulMode::kReplaying) return;  // the record's launch reads the positions buffer
    cuda_ops::AddPositionBias(F(*score), n, w, F(ape), dev, ratio, ctx_->stream);
    Launched("AddPositionBias");
  }

  void CompressorPool(const Tensor& kv, const Tensor& score, int64_t base_pos, int64_t first_window,
                      int64_t num_windows, int ratio, bool overlap, int64_t d, Tensor* out) override {
    const ProfileScope ps = Profile("CompressorPool");
    const int64_t width = RowWidth(kv), rows = kv.shape[0];
    Require(width == (overlap ? 2 : 1) * d && RowWidth(*out) == d, "CompressorPool", "shape");
    const int64_t first_row = (overlap && first_window >= 1 ? first_window - 1 : first_window) * ratio - base_pos;
    const int64_t last_row = (first_window + num_windows) * ratio - 1 - base_pos;
    Require(num_windows <= 0 || (first_row >= 0 && last_row < rows), "CompressorPool", "window rows not provided");
    Use();
    cuda_ops::CompressorPool(F(kv), F(score), width, base_pos, first_window, num_windows, ratio, overlap, d, F(*out),
                             ctx_->stream);
    Launched("CompressorPool");
  }

  void CompressorStep(const Tensor& kv, const Tensor& score, const CompressorSpec& spec,
                      const std::vector<CompressorSeq>& seqs) override {
    const int64_t width = (spec.overlap ? 2 : 1) * spec.dim;
    bool device_op = spec.dim <= cuda_ops::CompressorStepMaxDim() && kv.dtype == DType::kF32 &&
                     score.dtype == DType::kF32 && RowWidth(kv) == width && RowWidth(score) == width;
    for (const CompressorSeq& q : seqs)
      device_op = device_op && q.pending_kv->dtype == DType::kF32 && q.pending_score->dtype == DType::kF32;
    if (!device_op) {
      Unrecordable("CompressorStep", "shapes the device op does not take");
      if (logged_fallback_.insert("CompressorStep").second)
        std::fprintf(stderr, "[cuda] CompressorStep: entry width %lld or non-f32 rows: composed of CompressorPool, "
                             "RmsNorm, Rope and StoreKvRows instead (logged once)\n",
                     static_cast<long long>(spec.dim));
      Backend::CompressorStep(kv, score, spec, seqs);
      return;
    }
    const ProfileScope ps = ProfileStaged("CompressorStep");
    Use();
    cuda_ops::CompressorStepArgs args;
    args.kv = F(kv);
    args.score = F(score);
    args.ratio = spec.ratio;
    args.overlap = spec.overlap;
    args.dim = spec.dim;
    args.rope_dim = spec.rope_dim;
    args.norm = spec.norm ? F(*spec.norm) : nullptr;
    args.eps = spec.eps;
    args.inv_freq = Cached(*spec.inv_freq);
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
      dev[i].entries = Paged(*q.entries, std::max<int64_t>(end / spec.ratio, 1), spec.dim, &tables[i]);
    }
    for (size_t i = 0; i < dev.size(); i += most)
      cuda_ops::CompressorStep(args, dev.data() + i, static_cast<int>(std::min<size_t>(most, dev.size() - i)), stager_,
                               ctx_->stream);
    Launched("CompressorStep");
  }

  void RingWriteBatch(const std::vector<RingWrite>& writes) override {
    bool f32 = true;
    for (const RingWrite& w : writes) f32 = f32 && w.src->dtype == DType::kF32 && w.ring->dtype == DType::kF32;
    if (!f32) {
      Unrecordable("RingWriteBatch", "rings that are not f32");
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
    }
    if (!dev.empty()) cuda_ops::RingWriteBatch(dev.data(), static_cast<int>(dev.size()), stager_, ctx_->stream);
    Launched("RingWriteBatch");
  }

  // ---- indexer ----
  void IndexerTopK(const Tensor& q, const Tensor& weights, const PagedRows& keys, int64_t num_keys, int64_t heads,
                   int64_t dim, const int64_t* positions, int ratio, int top_k, Tensor* out) override {
    const ProfileScope ps = ProfileStaged("IndexerTopK");
    const int64_t n = q.shape[0];
    Require(RowWidth(*out) == top_k && out->dtype == DType::kI32, "IndexerTopK", "output shape");
    Require(num_keys <= keys.capacity(), "IndexerTopK", "more keys than the block table holds");
    Tensor pos, table;
    const int64_t* dev = StepPositions(positions, n, &pos);
    const cuda_ops::PagedRowsDev paged = Paged(keys, num_keys, dim, &table);
    const int64_t ld = LaunchShape(IndexerKeysLd(n, num_keys, ratio));
    Tensor scratch = Temp(DType::kF32, {cuda_ops::IndexerScratchFloats(n, ld)});
    cuda_ops::IndexerTopK(F(q), F(weights), paged, num_keys, heads, dim, dev, n, ratio, top_k, ld, F(scratch),
                          static_cast<int32_t*>(out->data), stager_, ctx_->stream);
    Launched("IndexerTopK");
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
      dev[i].keys = Paged(*a.keys, a.num_keys, dim, &tables[i]);
      dev[i].num_keys = a.num_keys;
      max_keys = std::max(max_keys, a.num_keys);
    }
    Tensor pos;
    const int64_t* dev_pos = StepPositions(positions, n, &pos);
    const int64_t ld = LaunchShape(IndexerKeysLd(n, max_keys, ratio));
    Tensor scratch = Temp(DType::kF32, {cuda_ops::IndexerScratchFloats(n, ld)});
    cuda_ops::IndexerTopKBatch(F(q), F(weights), dev.data(), static_cast<int>(dev.size()), heads, dim, dev_pos, n,
                               ratio, top_k, ld, F(scratch), static_cast<int32_t*>(out->data), stager_, ctx_->stream);
    Launched("IndexerTopKBatch");
  }

  // ---- attention ----
  void Attention(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring, const Tensor& new_kv,
                 int window, const PagedRows* entries, int64_t num_entries, int ratio, const Tensor* topk,
                 const Tensor& sinks, float softmax_scale, Tensor* out) override {
    const ProfileScope ps = ProfileStaged("Attention");
    Require(RowWidth(q) == heads * d && RowWidth(*out) == heads * d, "Attention", "shape");
    Require(!entries || num_entries <= entries->capacity(), "Attention", "more entries than the block table holds");
    Use();
    Tensor table;
    const cuda_ops::PagedRowsDev paged = entries ? Paged(*entries, num_entries, d, &table) : cuda_ops::PagedRowsDev{};
    // Prefill chunks (more rows than a decode bucket) take the tensor-core kernel unless the knob or the
    // head_dim / device says otherwise; decode steps the split kernel.
    const bool prefill = q.shape[0] > kGraphMaxRows;
    const bool fp16 = prefill_attention_ == PrefillAttention::kMmaFp16;
    const bool mma = prefill && (fp16 || prefill_attention_ == PrefillAttention::kMma) &&
                     cuda_ops::AttentionPrefillSupported(d, fp16);
    if (prefill && !logged_prefill_attention_) {
      const char* path = mma && fp16 ? "tensor cores, fp16 operands, fp32 accumulation"
                         : mma       ? "tensor cores, fp16 high + low operand parts (3 mma per product), fp32 "
                                       "accumulation"
                         : prefill_attention_ == PrefillAttention::kPerRow ? "one block per (row, head), f32"
                         : prefill_attention_ == PrefillAttention::kSplit  ? "split over keys in 16-row slices, f32"
                                                                           : "split over keys in 16-row slices, f32 "
                                                                             "(no tensor-core kernel for this "
                                                                             "head_dim on this device)";
      std::fprintf(stderr, "[cuda] prefill attention (steps of more than %d rows): %s (head_dim %lld)\n",
                   static_cast<int>(kGraphMaxRows), path, static_cast<long long>(d));
      logged_prefill_attention_ = true;
    }
    if (mma) {
      Unrecordable("Attention", "a prefill chunk");
      cuda_ops::AttentionPrefill(F(q), q.shape[0], heads, d, start, F(ring), ring.shape[0], F(new_kv), window, paged,
                                 num_entries, ratio, topk ? I32(*topk) : nullptr, topk ? RowWidth(*topk) : 0, F(sinks),
                                 softmax_scale, fp16, F(*out), ctx_->stream);
      Launched("Attention");
      return;
    }
    const bool split_keys = !prefill || prefill_attention_ != PrefillAttention::kPerRow;
    const int64_t split_floats = split_keys ? cuda_ops::AttentionSplitScratchFloats(q.shape[0], heads, d) : 0;
    Tensor split = split_floats > 0 ? Temp(DType::kF32, {split_floats}) : Tensor{};
    cuda_ops::Attention(F(q), q.shape[0], heads, d, start, F(ring), ring.shape[0], F(new_kv), window,
                        paged, num_entries, ratio,
                        topk ? I32(*topk) : nullptr, topk ? RowWidth(*topk) : 0, F(sinks), softmax_scale, F(*out),
                        split_floats > 0 ? F(split) : nullptr, stager_, ctx_->stream);
    Launched("Attention");
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
    cuda_ops::EncodeKvRows(F(src) + src_row * dim, rows, dim, rope_dim, RowKindOf(dst->dtype), bytes,
                           static_cast<uint8_t*>(dst->data) + dst_row * bytes, ctx_->stream);
    Launched("StoreKvRows");
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
      if (a.entries) dev[i].entries = Paged(*a.entries, a.num_entries, d, &tables[i]);
      dev[i].num_entries = a.entries ? a.num_entries : 0;
    }
    Tensor split = Temp(DType::kF32, {cuda_ops::AttentionSplitScratchFloats(n, heads, d)});
    cuda_ops::AttentionBatch(F(q), n, heads, d, F(new_kv), window, ratio, topk ? I32(*topk) : nullptr,
                             topk ? RowWidth(*topk) : 0, dev.data(), static_cast<int>(dev.size()), F(sinks),
                             softmax_scale, F(*out), F(split), stager_, ctx_->stream);
    Launched("AttentionBatch");
  }

  void UpdateRing(const Tensor& new_kv, int64_t start, int window, Tensor* ring) override {
    const ProfileScope ps = Profile("UpdateRing");
    Require(ring->shape[0] >= window, "UpdateRing", "ring has fewer slots than the window");
    Use();
    cuda_ops::UpdateRing(F(new_kv), new_kv.shape[0], RowWidth(new_kv), start, ring->shape[0], F(*ring), ctx_->stream);
    Launched("UpdateRing");
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
    const cuda_ops::PagedRowsDev paged = entries ? Paged(*entries, num_entries, d, &table) : cuda_ops::PagedRowsDev{};
    const Tensor from = Staged(visible_from, n), to = Staged(visible_to, n);
    cuda_ops::SpanWindowAttention(F(q), n, heads, d, start, F(ring), ring.shape[0], F(new_kv),
                                  static_cast<const int64_t*>(from.data), static_cast<const int64_t*>(to.data), paged,
                                  num_entries, ratio, topk ? I32(*topk) : nullptr, topk ? RowWidth(*topk) : 0,
                                  F(sinks), softmax_scale, F(*out), ctx_->stream);
    Launched("SpanWindowAttention");
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
    Launched("RotateHalf");
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
    const Tensor dev = Staged(tiles.data(), static_cast<int64_t>(tiles.size()));
    cuda_ops::SpanAttention(F(q), F(k), F(v), heads, d, I32(dev), static_cast<int64_t>(tiles.size() / 4), softmax_scale,
                            F(*out), ctx_->stream);
    Launched("SpanAttention");
  }

  void Gelu(Tensor* x) override {
    const ProfileScope ps = Profile("Gelu");
    Require(x->dtype == DType::kF32, "Gelu", "f32 only");
    Use();
    cuda_ops::Gelu(F(*x), x->numel(), ctx_->stream);
    Launched("Gelu");
  }

  void Unfold2D(const Tensor& x, int64_t h, int64_t w, int r, Tensor* out) override {
    const ProfileScope ps = Profile("Unfold2D");
    const int64_t C = RowWidth(x);
    Require(h > 0 && w > 0 && r > 0 && x.shape[0] == h * w, "Unfold2D", "x must hold h*w rows");
    Require(out->shape[0] == ((h + r - 1) / r) * ((w + r - 1) / r) && RowWidth(*out) == C * r * r, "Unfold2D",
            "output shape");
    Use();
    cuda_ops::Unfold2D(F(x), h, w, C, r, F(*out), ctx_->stream);
    Launched("Unfold2D");
  }

  // ---- MoE ----
  void MoeRoute(const Tensor& logits, const int32_t* tokens, const RouterParams& p, Tensor* idx,
                Tensor* weight) override {
    const ProfileScope ps = Profile("MoeRoute");
    const int64_t n = logits.shape[0], E = RowWidth(logits);
    Require(RowWidth(*idx) == p.top_k && RowWidth(*weight) == p.top_k, "MoeRoute", "output shape");
    Require(!p.image_rows || (p.bias_vl && p.bias_vl->numel() == E), "MoeRoute", "image rows without bias_vl [E]");
    Tensor toks;
    const int32_t* table = nullptr;
    const int32_t* dev_tokens = nullptr;
    if (p.hash) {
      Require(p.tid2eid && p.tid2eid->data, "MoeRoute", "hash layer without tid2eid");
      dev_tokens = StepTokens(tokens, n, &toks);
      table = CachedTable(*p.tid2eid);
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
    Launched("MoeRoute");
  }

  void MoeExperts(const Tensor& x, const Tensor& idx, const Tensor& weight, const std::vector<ExpertWeights>& experts,
                  float limit, Tensor* out) override {
    const ProfileScope ps = Profile("MoeExperts");
    const int64_t n = x.shape[0], k = RowWidth(idx);
    Use();
    FusedMoe* fused = FusedFor(experts, limit, static_cast<int>(k));
    if (fused && n > kExl3MoeMaxRows && !prefill_moe_per_expert_ && !prefill_moe_row_slices_ &&
        n * k <= cuda_ops::kMoeSortMaxPairs) {
      MoeExpertsSortedPairs(x, idx, weight, *fused, out);
      return;
    }
    if (fused && (n <= kExl3MoeMaxRows || !prefill_moe_per_expert_)) {
      // Steps of more rows reach this only with DSMESH_CUDA_PREFILL_MOE=row-slices or more pairs than the
      // device sort takes (kMoeSortMaxPairs): the single-launch kernel on slices of kExl3MoeMaxRows rows,
      // reading an expert once per slice that uses it. Each row's result does not depend on its slice.
      const int64_t D = RowWidth(x);
      Tensor xh = Temp(DType::kF16, {n, D});
      cuda_ops::ToHalfPadded(F(x), n, D, D, static_cast<uint16_t*>(xh.data), D, 0, ctx_->stream);
      Tensor y = Temp(DType::kF32, {n, D});
      for (int64_t r0 = 0; r0 < n; r0 += kExl3MoeMaxRows) {
        const int64_t m = std::min<int64_t>(kExl3MoeMaxRows, n - r0);
        Exl3MoeForward(fused->layer->layer(), static_cast<const uint16_t*>(xh.data) + r0 * D, I32(idx) + r0 * k,
                       F(weight) + r0 * k, static_cast<int>(m), F(y) + r0 * D, *fused->workspace, ctx_->stream);
        ++g_fused_moe;
      }
      cuda_ops::Add(F(y), n * D, F(*out), ctx_->stream);
      Launched("MoeExperts (fused)");
      if (n > kExl3MoeMaxRows && !logged_many_rows_) {
        std::fprintf(stderr, "[cuda] routed experts: steps of more than %d rows (prefill chunks) run the fused kernel "
                             "on slices of %d rows\n", kExl3MoeMaxRows, kExl3MoeMaxRows);
        logged_many_rows_ = true;
      }
      return;
    }
    ++g_per_expert_moe;
    // Per expert: the routing leaves the device once (a sync), rows are grouped on the host.
    std::vector<int32_t> ix(n * k);
    std::vector<float> wt(n * k);
    ToHost(idx, ix.data());
    ToHost(weight, wt.data());
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
      if (!rows[e].empty()) RunExpert(x, rows[e], wts[e], experts[e], limit, out);
  }

  void SharedExpert(const Tensor& x, const ExpertWeights& expert, float limit, Tensor* out) override {
    const ProfileScope ps = Profile("SharedExpert");
    const int64_t m = x.shape[0], D = RowWidth(x), I = expert.w1.out;
    Tensor g = Temp(DType::kF32, {m, I}), u = Temp(DType::kF32, {m, I}), y = Temp(DType::kF32, {m, D});
    LinearBatch({{&x, &expert.w1, &g}, {&x, &expert.w3, &u}});
    cuda_ops::SwiGlu(F(g), F(u), m * I, limit, ctx_->stream);
    Linear(g, expert.w2, &y);
    cuda_ops::Add(F(y), m * D, F(*out), ctx_->stream);
    Launched("SharedExpert");
  }

  // ---- sampling (sampling_ops.h): only the tokens and the asked-for logprobs come back ----
  std::vector<SampledRow> SampleRows(const Tensor& logits, const std::vector<RowSampling>& rows) override {
    const ProfileScope ps = Profile("SampleRows");
    const int64_t n = static_cast<int64_t>(rows.size()), vocab = RowWidth(logits);
    Require(logits.dtype == DType::kF32 && logits.shape[0] == n, "SampleRows", "logits must be f32 [rows, vocab]");
    Require(vocab < (int64_t{1} << 31), "SampleRows", "vocabulary too large for 32-bit token ids");
    if (n == 0) return {};
    Use();
    if (capturing_) throw std::runtime_error("SampleRows inside a graph segment (its results go to the host)");
    std::vector<cuda_ops::SampleRowParams> params(n);
    for (int64_t r = 0; r < n; ++r) {
      const RowSampling& q = rows[r];
      Require(q.logprobs <= cuda_ops::kSampleMaxTopLogprobs, "SampleRows", "more than 20 top logprobs");
      params[r] = {q.temperature, q.top_k, q.top_p, q.min_p, q.seed, q.position, q.logprobs};
    }
    Tensor dparams = Temp(DType::kU8, {static_cast<int64_t>(n * sizeof(cuda_ops::SampleRowParams))});
    Tensor dout = Temp(DType::kU8, {static_cast<int64_t>(n * sizeof(cuda_ops::SampleRowOut))});
    Tensor scratch = Temp(DType::kU8, {cuda_ops::SampleRowsScratchBytes(n, vocab)});
    CudaCheck(cudaMemcpyAsync(dparams.data, params.data(), dparams.nbytes(), cudaMemcpyHostToDevice, ctx_->stream),
              "SampleRows parameters upload");
    cuda_ops::SampleRows(F(logits), n, vocab, static_cast<const cuda_ops::SampleRowParams*>(dparams.data), scratch.data,
                         static_cast<cuda_ops::SampleRowOut*>(dout.data), ctx_->stream);
    Launched("SampleRows");
    std::vector<cuda_ops::SampleRowOut> host(n);
    ToHost(dout, host.data());
    std::vector<SampledRow> out(n);
    for (int64_t r = 0; r < n; ++r) {
      out[r].token = host[r].token;
      if (rows[r].logprobs < 0) continue;
      out[r].logprob = host[r].logprob;
      const int top = static_cast<int>(std::min<int64_t>(rows[r].logprobs, vocab));
      out[r].top_ids.assign(host[r].top_ids, host[r].top_ids + top);
      out[r].top_logprobs.assign(host[r].top_logprobs, host[r].top_logprobs + top);
    }
    return out;
  }

  // The stream every op runs on (CudaBackendStream).
  cudaStream_t stream() const { return ctx_->stream; }

 private:
  struct FusedMoe {
    std::unique_ptr<Exl3DeviceMoeLayer> layer;
    std::unique_ptr<Exl3MoeWorkspace> workspace;
    int topk = 0;
  };

  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int64_t nodes = 0;
    size_t scratch_begin = 0, scratch_end = 0;
    bool failed = false;
  };

  void Use() const { CudaCheck(cudaSetDevice(ctx_->device), "cudaSetDevice"); }

  Exl3GemvWorkspace& MainGemvWorkspace() {
    if (!gemv_ws_) gemv_ws_ = std::make_unique<Exl3GemvWorkspace>(size_t{256} << 20);
    return *gemv_ws_;
  }

  // y = x W on `stream` (dense or EXL3; EXL3 GEMMs only on the main stream).
  void LinearOn(const Tensor& x, const LinearWeight& w, Tensor* out, cudaStream_t stream, Exl3GemvWorkspace& ws) {
    const int64_t m = x.shape[0];
    if (w.is_exl3()) {
      auto& e = *static_cast<CudaExl3Linear*>(w.exl3.get());
      Exl3Apply(PartFor(e, e.slice.out_begin, e.slice.out_end), F(x), w.in, m, F(*out), w.out, false, stream, ws);
      return;
    }
    const cuda_ops::WType type = WTypeOf(w.dense.dtype, w.name);
    if (m > kGraphMaxRows && !w.bias.data && DenseGemm::Takes(type, w.out, w.in)) {
      const Tensor wf = Temp(DType::kF32, {w.out, w.in});
      dense_gemm_.Run(F(x), w.in, m, w.dense.data, type, w.out, w.in, F(wf), F(*out), w.out, stream);
      Launched("Linear (cuBLAS)");
      return;
    }
    cuda_ops::DenseLinear(F(x), w.in, m, w.dense.data, type, w.in, w.out, w.in, w.bias.data ? F(w.bias) : nullptr,
                          F(*out), w.out, stream);
    Launched("Linear");
  }

  // Independent launches overlap on side streams only inside a step whose temporaries fit the arena
  // (a temporary from the stream-ordered pool would be freed on the main stream while a side stream
  // may still read it).
  // Requested but not possible (outside a step, or the arena nearly full) runs in order, logged once.
  bool ConcurrencyAllowed() {
    if (!options_.concurrent_linears) return false;
    if (in_step_ && arena_top_ + (size_t{64} << 20) <= arena_bytes_) return true;
    if (!logged_serial_linears_) {
      std::fprintf(stderr, "[cuda] --concurrent-linears: linears outside a step or with the scratch arena nearly "
                           "full run in order (logged once)\n");
      logged_serial_linears_ = true;
    }
    return false;
  }

  // Runs job(i, stream, workspace) for i < n on side streams (each with its own GEMV workspace) that
  // start after the main stream's work so far; the main stream then waits for all of them. Event fork
  // and join, so a graph capture records the jobs as parallel branches.
  void Concurrently(int n, const std::function<void(int, cudaStream_t, Exl3GemvWorkspace&)>& job) {
    if (side_.empty()) {
      CudaCheck(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate (fork)");
      side_.resize(kSideStreams);
      for (SideStream& sd : side_) {
        CudaCheck(cudaStreamCreateWithFlags(&sd.stream, cudaStreamNonBlocking), "cudaStreamCreate (side)");
        CudaCheck(cudaEventCreateWithFlags(&sd.done, cudaEventDisableTiming), "cudaEventCreate (join)");
        sd.gemv_ws = std::make_unique<Exl3GemvWorkspace>(size_t{64} << 20);
      }
    }
    const int used = std::min(n, kSideStreams);
    CudaCheck(cudaEventRecord(fork_, ctx_->stream), "cudaEventRecord (fork)");
    for (int i = 0; i < used; ++i) CudaCheck(cudaStreamWaitEvent(side_[i].stream, fork_, 0), "cudaStreamWaitEvent (fork)");
    for (int i = 0; i < n; ++i) {
      SideStream& sd = side_[i % kSideStreams];
      job(i, sd.stream, *sd.gemv_ws);
    }
    for (int i = 0; i < used; ++i) {
      CudaCheck(cudaEventRecord(side_[i].done, side_[i].stream), "cudaEventRecord (join)");
      CudaCheck(cudaStreamWaitEvent(ctx_->stream, side_[i].done, 0), "cudaStreamWaitEvent (join)");
    }
  }

  // Brackets an op for the profiler (a no-op unless profiling is on and a step is open).
  struct ProfileScope {
    OpProfiler* profiler;
    ~ProfileScope() {
      if (profiler) profiler->End();
    }
  };
  // Ops whose launches take their parameters by value call Profile: inside a stateful segment that is
  // recorded they cannot run (Unrecordable). Ops that stage their parameters call ProfileStaged.
  ProfileScope Profile(const std::string& op) {
    if (stateful_mode_ != StatefulMode::kNone) Unrecordable(op.c_str(), "launch parameters not staged");
    return ProfileStaged(op.c_str());
  }
  ProfileScope Profile(const char* op) {
    if (stateful_mode_ != StatefulMode::kNone) Unrecordable(op, "launch parameters not staged");
    return ProfileStaged(op);
  }
  ProfileScope ProfileStaged(const char* op) {
    if (!profiler_ || !in_step_) return {nullptr};
    profiler_->Begin(std::string(op));
    return {profiler_.get()};
  }
  std::string LinearProfileName(const char* op, const LinearWeight& w) const {
    if (!profiler_ || !in_step_) return {};
    std::string name = op + LinearOpName(w.name);
    if (w.is_exl3()) return name + " [exl3 K" + std::to_string(static_cast<CudaExl3Linear*>(w.exl3.get())->weight.K) + "]";
    return name + " [" + DTypeName(w.dense.dtype) + "]";
  }

  // A temporary of the current step from the arena (contents undefined), or, outside a step or beyond
  // the arena, a zero-filled Alloc (an overflow is logged once and counted).
  Tensor Temp(DType dtype, std::vector<int64_t> shape) {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    const size_t bytes = (std::max<size_t>(t.nbytes(), 16) + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    if (in_step_ && arena_top_ + bytes <= arena_bytes_) {
      t.data = static_cast<char*>(arena_) + arena_top_;
      arena_top_ += bytes;
      return t;
    }
    if (in_step_) {
      if (capturing_) throw std::runtime_error("the scratch arena is full inside a graph segment");
      ++g_scratch_overflows;
      if (!logged_overflow_) {
        std::fprintf(stderr, "[cuda] a step needs more than the %zu MiB scratch arena; the rest comes from cudaMallocAsync\n",
                     arena_bytes_ >> 20);
        logged_overflow_ = true;
      }
    }
    return Alloc(t.dtype, t.shape);
  }

  // Paged rows with the block table on the device (only the blocks `rows` rows touch are copied).
  // An empty pool (no rows yet) gives a null pool pointer.
  cuda_ops::PagedRowsDev Paged(const PagedRows& p, int64_t rows, int64_t dim, Tensor* keep) {
    cuda_ops::PagedRowsDev d;
    if (rows <= 0 || !p.pool || !p.pool->data) return d;
    d.pool = p.pool->data;
    d.kind = RowKindOf(p.pool->dtype);
    d.row_bytes = RowWidth(*p.pool) * static_cast<int64_t>(DTypeSize(p.pool->dtype));
    if (d.row_bytes != KvRowBytes(p.pool->dtype, dim, p.rope_dim))
      throw std::invalid_argument("paged rows: " + std::to_string(d.row_bytes) + "-byte rows of " +
                                  DTypeName(p.pool->dtype) + " do not hold " + std::to_string(dim) + " values");
    d.nope = static_cast<int32_t>(d.kind == cuda_ops::RowKind::kFp8 ? dim - p.rope_dim : 0);
    if (p.rows_per_block <= 0 || p.rows_per_block > INT32_MAX || p.capacity() > INT32_MAX)
      throw std::invalid_argument("paged rows: " + std::to_string(p.rows_per_block) + " rows per block x " +
                                  std::to_string(p.table_len) + " blocks exceeds the kernels' 32-bit row index");
    d.rows_per_block = static_cast<int32_t>(p.rows_per_block);
    d.block_shift = (p.rows_per_block & (p.rows_per_block - 1)) == 0 ? __builtin_ctzll(p.rows_per_block) : -1;
    d.table = StepTables(p.table, (rows + p.rows_per_block - 1) / p.rows_per_block, keep);
    return d;
  }

  // The device copy of host metadata: the step's own arrays (BeginStep) without a copy, else a copy.
  template <class T>
  const T* StepMeta(const T* host, int64_t n, const T* step_host, int64_t step_len, const T* step_device,
                    Tensor* keep) {
    if (in_step_ && step_host && host >= step_host && host + n <= step_host + step_len)
      return step_device + (host - step_host);
    *keep = Staged(host, n);
    return static_cast<const T*>(keep->data);
  }
  const int32_t* StepTokens(const int32_t* host, int64_t n, Tensor* keep) {
    return StepMeta(host, n, step_tokens_, step_n_, step_tokens_on_device_, keep);
  }
  const int64_t* StepPositions(const int64_t* host, int64_t n, Tensor* keep) {
    return StepMeta(host, n, step_positions_, step_n_, step_positions_on_device_, keep);
  }
  const int32_t* StepTables(const int32_t* host, int64_t n, Tensor* keep) {
    return StepMeta(host, n, step_tables_, step_tables_len_, static_cast<const int32_t*>(step_tables_dev_), keep);
  }

  // The step's block tables into their own device buffer (not the arena, whose offsets the graphs
  // check), through a pinned copy; both grow as tables do. Called after the previous upload finished.
  void UploadTables(const int32_t* tables, int64_t len) {
    step_tables_ = tables;
    step_tables_len_ = len;
    if (len <= 0) return;
    CudaCheck(cudaEventSynchronize(step_uploaded_), "step metadata upload");
    if (len > step_tables_cap_) {
      const int64_t cap = std::max<int64_t>(len * 2, 1024);
      if (step_tables_dev_) CudaCheck(cudaFree(step_tables_dev_), "cudaFree of the step's block tables");
      if (step_tables_pinned_) CudaCheck(cudaFreeHost(step_tables_pinned_), "cudaFreeHost of the step's block tables");
      CudaCheck(cudaMalloc(&step_tables_dev_, cap * sizeof(int32_t)), "cudaMalloc for the step's block tables");
      CudaCheck(cudaMallocHost(&step_tables_pinned_, cap * sizeof(int32_t)), "cudaMallocHost for block tables");
      step_tables_cap_ = cap;
    }
    std::memcpy(step_tables_pinned_, tables, static_cast<size_t>(len) * sizeof(int32_t));
    CudaCheck(cudaMemcpyAsync(step_tables_dev_, step_tables_pinned_, len * sizeof(int32_t), cudaMemcpyHostToDevice,
                              ctx_->stream),
              "block tables upload");
    CudaCheck(cudaEventRecord(step_uploaded_, ctx_->stream), "cudaEventRecord");
  }

  // Records `ops` on the stream into *exec and counts its nodes (launches and copies) into *nodes; returns
  // why that failed ("" on success).
  std::string CaptureGraph(const std::function<void()>& ops, cudaGraphExec_t* exec, int64_t* nodes) {
    std::string why;
    cudaGraph_t graph = nullptr;
    CudaCheck(cudaStreamBeginCapture(ctx_->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    capturing_ = true;
    try {
      ops();
    } catch (const std::exception& e) {
      why = e.what();
    }
    capturing_ = false;
    const cudaError_t end = cudaStreamEndCapture(ctx_->stream, &graph);
    if (why.empty() && end != cudaSuccess) why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
    if (why.empty()) {
      size_t count = 0;
      if (cudaGraphGetNodes(graph, nullptr, &count) == cudaSuccess) *nodes = static_cast<int64_t>(count);
      const cudaError_t inst = cudaGraphInstantiate(exec, graph, 0);
      if (inst != cudaSuccess) {
        why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
        *exec = nullptr;
      }
    }
    if (graph) cudaGraphDestroy(graph);
    if (!why.empty()) cudaGetLastError();
    return why;
  }

  // Records `ops` as a CUDA graph and launches it; on failure (an op that syncs or copies host metadata,
  // such as the per-expert MoE path) runs `ops` eagerly and never tries the key again.
  void Capture(const SegmentKey& key, Graph* g, const std::function<void()>& ops) {
    Use();
    const size_t begin = arena_top_;
    const std::string why = CaptureGraph(ops, &g->exec, &g->nodes);
    if (!why.empty()) {
      g->failed = true;
      ++g_graph_failures;
      if (!logged_capture_failure_)
        std::fprintf(stderr, "[cuda] graph capture failed (site %d, layer %d, rows %lld): %s; such segments run "
                             "eagerly (counted in CudaGraphCallCounts().failures; logged once)\n",
                     key.site, key.layer, static_cast<long long>(key.rows), why.c_str());
      logged_capture_failure_ = true;
      arena_top_ = begin;
      ++g_eager_segments;
      ops();
      return;
    }
    g->scratch_begin = begin;
    g->scratch_end = arena_top_;
    if (!logged_graphs_) {
      std::fprintf(stderr, "[cuda] decode steps of up to %lld rows replay CUDA graphs (collectives stay eager; "
                           "--enforce-eager turns graphs off)\n", static_cast<long long>(kGraphMaxRows));
      logged_graphs_ = true;
    }
    ++g_graph_captures;
    CudaCheck(cudaGraphLaunch(g->exec, ctx_->stream), "cudaGraphLaunch");
  }

  // A recorded stateful segment: its graph, and the pinned and device buffers its launches' parameter
  // blocks are staged in (one upload per replay).
  static constexpr size_t kStatefulParamBytes = size_t{32} << 10;  // a layer stages ~6 KiB at 8 sequences
  enum class StatefulMode { kNone, kProbing, kRecording, kReplaying };
  struct StatefulGraph {
    cudaGraphExec_t exec = nullptr;
    int64_t nodes = 0;
    size_t scratch_begin = 0, scratch_end = 0;
    bool failed = false;
    void* params_host = nullptr;  // pinned
    void* params_dev = nullptr;
    size_t params_used = 0, params_captured = 0;
    cudaEvent_t uploaded = nullptr;
    std::vector<int64_t> shapes;  // LaunchShape's values, in order
    size_t shapes_seen = 0;
  };

  // The ParamStager the launchers get: stages into the current stateful record's buffers, or else into the
  // eager ring (copied to the device right away, in stream order).
  class Stager final : public cuda_ops::ParamStager {
   public:
    explicit Stager(CudaBackend* be) : be_(be) {}
    const void* Stage(const void* host, size_t bytes) override { return be_->StageParams(host, bytes); }
    bool Launching() const override { return be_->stateful_mode_ != StatefulMode::kReplaying; }

   private:
    CudaBackend* be_;
  };

  // While alive, staged parameters go into `g`'s buffers and the backend is in `mode` (recording or
  // replaying: in a replay the staged ops do not launch).
  struct StagingInto {
    CudaBackend* be;
    StagingInto(CudaBackend* b, StatefulGraph* g, StatefulMode mode) : be(b) {
      be->staging_graph_ = g;
      g->params_used = 0;
      g->shapes_seen = 0;
      be->stateful_mode_ = mode;
    }
    ~StagingInto() {
      be->staging_graph_ = nullptr;
      be->stateful_mode_ = StatefulMode::kNone;
    }
  };

  // An op (or a path of one) whose launches a stateful record cannot hold: noted while probing a
  // segment's first run (which then is never recorded), an error while recording or replaying one.
  void Unrecordable(const char* op, const char* why) {
    if (stateful_mode_ == StatefulMode::kNone) return;
    const std::string what = std::string(op) + ": " + why;
    if (stateful_mode_ == StatefulMode::kProbing) {
      if (unrecordable_.empty()) unrecordable_ = what;
      return;
    }
    throw std::runtime_error("cuda backend: " + what + " inside a recorded stateful segment");
  }

  const void* StageParams(const void* host, size_t bytes) {
    const size_t size = (bytes + 15) / 16 * 16;
    if (staging_graph_) {
      StatefulGraph& g = *staging_graph_;
      if (g.params_used + size > kStatefulParamBytes)
        throw std::runtime_error("a stateful segment stages more than " + std::to_string(kStatefulParamBytes >> 10) +
                                 " KiB of launch parameters");
      std::memcpy(static_cast<char*>(g.params_host) + g.params_used, host, bytes);
      const void* dev = static_cast<char*>(g.params_dev) + g.params_used;
      g.params_used += size;
      return dev;
    }
    // A per-token segment's capture must not hold a copy from host memory that later steps rewrite.
    if (capturing_) throw std::runtime_error("staged launch parameters inside a per-token graph segment");
    if (!eager_params_host_) {
      CudaCheck(cudaMallocHost(&eager_params_host_, kEagerParamBytes), "cudaMallocHost for launch parameters");
      CudaCheck(cudaMalloc(&eager_params_dev_, kEagerParamBytes), "cudaMalloc for launch parameters");
    }
    if (size > kEagerParamBytes) throw std::runtime_error("launch parameters above the staging ring");
    if (eager_params_top_ + size > kEagerParamBytes) {  // wrap: every earlier copy must have read its bytes
      CudaCheck(cudaStreamSynchronize(ctx_->stream), "launch parameter ring");
      eager_params_top_ = 0;
    }
    char* h = static_cast<char*>(eager_params_host_) + eager_params_top_;
    char* d = static_cast<char*>(eager_params_dev_) + eager_params_top_;
    std::memcpy(h, host, bytes);
    CudaCheck(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, ctx_->stream), "launch parameter upload");
    eager_params_top_ += size;
    return d;
  }

  // The indexer's launch covers this many keys per row (IndexerScratchFloats' ld): in a step a graph may
  // record, bucket / ratio, which holds every key a row of the step can see (keys <= (position + 1) /
  // ratio) and changes only when the step's largest position crosses a power of two; else what it holds.
  int64_t IndexerKeysLd(int64_t n, int64_t max_keys, int ratio) const {
    if (in_step_ && n <= kGraphMaxRows && step_n_ <= kGraphMaxRows && step_key_bucket_ > 0 && ratio > 0)
      return std::max(max_keys, step_key_bucket_ / ratio);
    return max_keys;
  }

  // A value a staged launch's shape depends on beyond the record's key (the indexer's key count): kept
  // while recording, compared while replaying (a mismatch would replay the wrong shape: it throws).
  int64_t LaunchShape(int64_t v) {
    if (!staging_graph_) return v;
    StatefulGraph& g = *staging_graph_;
    if (stateful_mode_ == StatefulMode::kRecording) {
      g.shapes.push_back(v);
    } else if (stateful_mode_ == StatefulMode::kReplaying) {
      if (g.shapes_seen >= g.shapes.size() || g.shapes[g.shapes_seen] != v)
        throw std::runtime_error("cuda backend: a replayed stateful segment needs a launch of shape " +
                                 std::to_string(v) + " that its record does not hold");
      ++g.shapes_seen;
    }
    return v;
  }

  void LaunchStateful(StatefulGraph* g) {
    if (g->params_used > 0)
      CudaCheck(cudaMemcpyAsync(g->params_dev, g->params_host, g->params_used, cudaMemcpyHostToDevice, ctx_->stream),
                "stateful segment parameters upload");
    CudaCheck(cudaEventRecord(g->uploaded, ctx_->stream), "cudaEventRecord");
    CudaCheck(cudaGraphLaunch(g->exec, ctx_->stream), "cudaGraphLaunch");
    arena_top_ = g->scratch_end;
  }

  // Records a stateful segment: its ops stage into the record's buffers and launch into the capture.
  // A failure (an op that cannot be recorded) is logged once and the key runs eagerly from then on.
  void CaptureStateful(const SegmentKey& key, StatefulGraph* g, const std::function<void()>& ops) {
    Use();
    if (!g->params_host) {
      CudaCheck(cudaMallocHost(&g->params_host, kStatefulParamBytes), "cudaMallocHost for segment parameters");
      CudaCheck(cudaMalloc(&g->params_dev, kStatefulParamBytes), "cudaMalloc for segment parameters");
      CudaCheck(cudaEventCreateWithFlags(&g->uploaded, cudaEventDisableTiming), "cudaEventCreate");
    }
    const size_t begin = arena_top_;
    std::string why;
    {
      StagingInto into(this, g, StatefulMode::kRecording);
      why = CaptureGraph(ops, &g->exec, &g->nodes);
    }
    if (!why.empty()) {
      // The first run showed every op recordable, so this is unexpected. The ops ran their host logic
      // (sequence states moved on) but nothing they launched ran: the step cannot be redone here, so it
      // fails loudly; the key runs eagerly from the next step on.
      g->failed = true;
      ++g_graph_failures;
      throw std::runtime_error("cuda backend: recording the stateful segment (layer " + std::to_string(key.layer) +
                               ", rows " + std::to_string(key.rows) + ") failed: " + why);
    }
    g->scratch_begin = begin;
    g->scratch_end = arena_top_;
    g->params_captured = g->params_used;
    ++g_stateful_captures;
    if (!logged_stateful_graphs_) {
      std::fprintf(stderr, "[cuda] the stateful part of decode steps (compressors, indexer, attention) replays CUDA "
                           "graphs too, its parameters staged per step\n");
      logged_stateful_graphs_ = true;
    }
    ++g_graph_captures;
    LaunchStateful(g);
  }

  // The GEMM workspace is sized for the largest EXL3 block range loaded.
  void NoteExl3Slice(const Exl3Slice& sl) {
    const int64_t k = (sl.in_end + 127) / 128 * 128 - sl.in_begin / 128 * 128;
    const int64_t n = (sl.out_end + 127) / 128 * 128 - sl.out_begin / 128 * 128;
    max_k_ = std::max(max_k_, k);
    max_n_ = std::max(max_n_, n);
    max_weights_ = std::max(max_weights_, k * n);
  }

  // A step of several sequences that one launch cannot hold (a prefill chunk beside decodes, or more
  // sequences than the kernel takes) runs them one by one: counted, and logged once per op.
  void PerSequenceFallback(const char* op, int64_t rows, size_t seqs, int max_rows, int max_seqs) {
    ++g_per_sequence_fallbacks;
    if (!logged_fallback_.insert(op).second) return;
    std::fprintf(stderr, "[cuda] %s: a step of %lld rows in %zu sequences runs per sequence (one launch holds %d rows "
                         "of %d sequences); counted in CudaPerSequenceFallbacks(), logged once\n",
                 op, static_cast<long long>(rows), seqs, max_rows, max_seqs);
  }

  void Launched(const char* op) const {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw std::runtime_error(std::string("cuda backend ") + op + ": launch failed: " +
                                                   cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }

  // A device copy of a small host array, valid for this step.
  template <class T>
  Tensor Staged(const T* host, int64_t n) {
    Unrecordable("host metadata", "copied per call");
    if (capturing_) throw std::runtime_error("host metadata is copied inside a graph segment");
    Tensor t = Temp(sizeof(T) == 8 ? DType::kI64 : DType::kI32, {std::max<int64_t>(n, 1)});
    if (n > 0)
      CudaCheck(cudaMemcpyAsync(t.data, host, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice, ctx_->stream),
                "metadata upload");
    return t;
  }

  // Device copies of host tables that live as long as the model (rope frequencies, tid2eid), keyed by
  // host address. Each entry keeps what makes the key safe: a copy of a small table's values (compared
  // on every hit) or a reference to a tensor's host buffer (so its address cannot be reused).
  struct CachedCopy {
    void* device = nullptr;
    std::vector<char> values;
    std::shared_ptr<void> keep_alive;
  };
  const float* Cached(const std::vector<float>& v) {
    const size_t bytes = v.size() * sizeof(float);
    std::lock_guard<std::mutex> lock(cache_mu_);
    CachedCopy& c = host_cache_[{v.data(), bytes}];
    if (c.device && std::memcmp(c.values.data(), v.data(), bytes) == 0) return static_cast<const float*>(c.device);
    if (!c.device) CudaCheck(cudaMalloc(&c.device, std::max<size_t>(bytes, 16)), "cudaMalloc for a rope table");
    c.values.assign(reinterpret_cast<const char*>(v.data()), reinterpret_cast<const char*>(v.data()) + bytes);
    CudaCheck(cudaMemcpy(c.device, v.data(), bytes, cudaMemcpyHostToDevice), "rope table upload");
    return static_cast<const float*>(c.device);
  }
  // tid2eid arrives as a host tensor (the loader keeps routing tables on the host) or already on device.
  const int32_t* CachedTable(const Tensor& t) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto known = host_cache_.find({t.data, t.nbytes()});
    if (known != host_cache_.end() && known->second.device) return static_cast<const int32_t*>(known->second.device);
    if (device_tables_.count(t.data)) return I32(t);
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, t.data) == cudaSuccess && a.type == cudaMemoryTypeDevice) {
      device_tables_.insert(t.data);
      return I32(t);
    }
    cudaGetLastError();
    CachedCopy& c = host_cache_[{t.data, t.nbytes()}];
    if (!c.device) {
      CudaCheck(cudaMalloc(&c.device, std::max<size_t>(t.nbytes(), 16)), "cudaMalloc for a routing table");
      CudaCheck(cudaMemcpy(c.device, t.data, t.nbytes(), cudaMemcpyHostToDevice), "routing table upload");
      c.keep_alive = t.owner;
    }
    return static_cast<const int32_t*>(c.device);
  }

  Exl3Part& PartFor(CudaExl3Linear& e, int64_t out_begin, int64_t out_end) {
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
      part->bias = Upload(hb);
    }
    slot = std::move(part);
    return *slot;
  }

  // out[m, nout] (row stride ldo; += when accumulate) = x[m, kin] (row stride ldx) W_part.
  void Exl3Apply(const Exl3Part& part, const float* x, int64_t ldx, int64_t m, float* out, int64_t ldo,
                 bool accumulate) {
    Exl3Apply(part, x, ldx, m, out, ldo, accumulate, ctx_->stream, MainGemvWorkspace());
  }
  // The same on `stream` with its own GEMV workspace (m <= kExl3GemvMaxRows off the main stream).
  void Exl3Apply(const Exl3Part& part, const float* x, int64_t ldx, int64_t m, float* out, int64_t ldo,
                 bool accumulate, cudaStream_t stream, Exl3GemvWorkspace& gemv_ws) {
    Require(m <= kExl3GemvMaxRows || stream == ctx_->stream, "EXL3 linear", "a GEMM off the main stream");
    const Exl3DeviceLinear& lin = part.buffers->linear();
    Tensor xh = Temp(DType::kF16, {m, lin.k});
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
      y = Temp(DType::kF32, {m, lin.n});
    }
    cuda_ops::ToHalfPadded(x, m, part.kin, ldx, static_cast<uint16_t*>(xh.data), lin.k, part.x_col0, stream);
    const uint16_t* xp = static_cast<const uint16_t*>(xh.data);
    if (m <= kExl3GemvMaxRows) {
      Exl3Gemv(lin, xp, static_cast<int>(m), y.data, Exl3Out::kF32, gemv_ws, stream);
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
        Exl3Gemm(lin, xp + r0 * lin.k, rows, F(y) + r0 * lin.n, Exl3Out::kF32, *gemm_ws_, ctx_->stream);
      }
    }
    if (!direct)
      cuda_ops::TakeColumns(F(y), m, lin.n, part.y_col0, part.nout, part.bias.data ? F(part.bias) : nullptr, out, ldo,
                            accumulate, stream);
    Launched("EXL3 linear");
  }

  // One batched GEMV launch on the main stream, counted (CudaGemvBatchCounts) and announced once.
  void LaunchGemvBatch(const Exl3GemvJob* jobs, int count, int m) {
    Exl3GemvBatch(jobs, count, m, Exl3Out::kF32, MainGemvWorkspace(), ctx_->stream);
    Launched("EXL3 GEMV batch");
    if (count > 1) {
      ++g_gemv_batches;
      g_gemv_batched_linears += count;
      if (!logged_gemv_batch_) {
        std::fprintf(stderr, "[cuda] EXL3 linears of one layer share launches (batched GEMV, up to %d per launch)\n",
                     kExl3GemvMaxBatch);
        logged_gemv_batch_ = true;
      }
    }
  }

  // Runs the EXL3 jobs of at most 16 rows whose slice is a whole linear written straight into its output
  // as batched GEMVs: one fp16 conversion per distinct input, one launch per set of up to
  // kExl3GemvMaxBatch linears of the same K, codebook, k and rows. Returns the jobs it left (other
  // linears, and a job with no partner to share a launch with), in their order.
  std::vector<LinearJob> BatchedExl3Gemvs(const std::vector<LinearJob>& jobs) {
    struct Taken {
      const LinearJob* job;
      const Exl3DeviceLinear* lin;
    };
    std::vector<Taken> taken;
    std::vector<LinearJob> rest;
    for (const LinearJob& j : jobs) {
      const int64_t m = j.x->shape[0];
      const Exl3DeviceLinear* lin = nullptr;
      if (j.w->is_exl3() && m >= 1 && m <= kExl3GemvMaxRows && RowWidth(*j.x) == j.w->in &&
          reinterpret_cast<uintptr_t>(j.out->data) % 16 == 0) {
        auto& e = *static_cast<CudaExl3Linear*>(j.w->exl3.get());
        const Exl3Part& part = PartFor(e, e.slice.out_begin, e.slice.out_end);
        const Exl3DeviceLinear& l = part.buffers->linear();
        if (part.x_col0 == 0 && part.kin == l.k && l.k == j.w->in && part.y_col0 == 0 && part.nout == l.n &&
            l.n == j.w->out && !part.bias.data)
          lin = &l;
      }
      if (lin) {
        taken.push_back({&j, lin});
      } else {
        rest.push_back(j);
      }
    }
    // Sets that share a launch: same K, codebook, k and rows, at most kExl3GemvMaxBatch each.
    std::vector<std::vector<const Taken*>> sets;
    for (const Taken& t : taken) {
      std::vector<const Taken*>* home = nullptr;
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
    if (sets.size() == taken.size()) return jobs;  // no two linears to put in one launch
    const ProfileScope ps = Profile("LinearBatch (batched EXL3 GEMV)");
    Use();
    std::vector<std::pair<const float*, Tensor>> halves;  // one fp16 copy per distinct input
    const auto half_of = [&](const Tensor& x) -> const uint16_t* {
      for (const auto& [src, h] : halves)
        if (src == F(x)) return static_cast<const uint16_t*>(h.data);
      const int64_t m = x.shape[0], k = RowWidth(x);
      Tensor h = Temp(DType::kF16, {m, k});
      cuda_ops::ToHalfPadded(F(x), m, k, k, static_cast<uint16_t*>(h.data), k, 0, ctx_->stream);
      halves.emplace_back(F(x), h);
      return static_cast<const uint16_t*>(h.data);
    };
    for (const auto& set : sets) {
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

  // A grouped EXL3 linear of m <= 16 rows as one group-major fp16 conversion, one batched GEMV launch over
  // the groups and (m > 1) one scatter back into rows. False when a group's slice is not a whole EXL3
  // linear (the caller then runs them group by group).
  bool GroupedExl3Rows(const Tensor& x, const LinearWeight& w, int groups, Tensor* out) {
    auto& e = *static_cast<CudaExl3Linear*>(w.exl3.get());
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
    Tensor xh = Temp(DType::kF16, {m, groups * w.in});
    cuda_ops::GroupMajorToHalf(F(x), m, groups, w.in, static_cast<uint16_t*>(xh.data), ctx_->stream);
    Tensor yg = m == 1 ? *out : Temp(DType::kF32, {m, w.out});
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
    Launched("GroupedLinear (EXL3, grouped rows)");
    return true;
  }

  // The single-launch kernel for this layer's experts, or null (with the reason logged once) when the
  // experts are not all full-width MCG EXL3 of one K.
  FusedMoe* FusedFor(const std::vector<ExpertWeights>& experts, float limit, int topk) {
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
        auto& c = *static_cast<CudaExl3Linear*>(lw->exl3.get());
        if (c.weight.codebook != Exl3Codebook::kMcg) {
          why = std::string("codebook ") + Exl3CodebookName(c.weight.codebook);
          break;
        }
        if (c.weight.bias) {
          why = "expert biases";
          break;
        }
        const Exl3Part& part = PartFor(c, c.slice.out_begin, c.slice.out_end);
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
        f->workspace = std::make_unique<Exl3MoeWorkspace>(kExl3MoeMaxRows, f->topk, ml.hidden, ml.inter);
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

  // Routed experts of a prefill chunk (model_ops_moe.cu): the n x k (row, slot) pairs sorted by expert on
  // the device, all of them in one launch of the routed-expert kernel (Exl3MoeForwardSorted: each expert
  // decoded once per 16 of its pairs), the pairs' outputs (routing weight applied) summed back into their
  // rows in slot order. No host sync. The workspace is shared by the layers (same stream) and grows with
  // the largest chunk (outside any capture: prefill chunks run eagerly).
  void MoeExpertsSortedPairs(const Tensor& x, const Tensor& idx, const Tensor& weight, FusedMoe& fused, Tensor* out) {
    const int64_t n = x.shape[0], k = RowWidth(idx), D = RowWidth(x), P = n * k;
    const Exl3MoeLayer& layer = fused.layer->layer();
    if (!sorted_ws_ || sorted_ws_->max_rows() < P || sorted_ws_->hidden() != layer.hidden ||
        sorted_ws_->inter() != layer.inter) {
      sorted_ws_.reset();
      sorted_ws_ = Exl3MoeWorkspace::ForSortedPairs(static_cast<int>(P), layer.hidden, layer.inter);
    }
    Tensor ids = Temp(DType::kI32, {P}), w = Temp(DType::kF32, {P}), src = Temp(DType::kI32, {P}),
           pos = Temp(DType::kI32, {P});
    int32_t* ids_p = static_cast<int32_t*>(ids.data);
    cuda_ops::SortPairsByExpert(I32(idx), F(weight), n, static_cast<int>(k), layer.num_experts, ids_p, F(w),
                                static_cast<int32_t*>(src.data), static_cast<int32_t*>(pos.data), ctx_->stream);
    Tensor xh = Temp(DType::kF16, {P, D});
    cuda_ops::GatherRowsToHalf(F(x), D, I32(src), P, static_cast<uint16_t*>(xh.data), ctx_->stream);
    Tensor y = Temp(DType::kF32, {P, D});
    Exl3MoeForwardSorted(layer, static_cast<const uint16_t*>(xh.data), ids_p, F(w), static_cast<int>(P), F(y),
                         *sorted_ws_, ctx_->stream);
    ++g_fused_moe;
    cuda_ops::AddPairsToRows(F(y), I32(pos), ids_p, n, static_cast<int>(k), D, F(*out), ctx_->stream);
    Launched("MoeExperts (sorted pairs)");
    if (!logged_sorted_pairs_) {
      std::fprintf(stderr, "[cuda] routed experts: steps of more than %d rows (prefill chunks) run the fused kernel "
                           "once over their (row, expert) pairs sorted by expert\n", static_cast<int>(kExl3MoeMaxRows));
      logged_sorted_pairs_ = true;
    }
  }

  void RunExpert(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<float>& wts,
                 const ExpertWeights& e, float limit, Tensor* out) {
    const int64_t m = rows.size(), D = RowWidth(x), I = e.w1.out;
    Tensor ri = Staged(rows.data(), m);
    Tensor wv = Temp(DType::kF32, {m});
    CudaCheck(cudaMemcpyAsync(wv.data, wts.data(), m * sizeof(float), cudaMemcpyHostToDevice, ctx_->stream),
              "expert weights upload");
    Tensor xs = Temp(DType::kF32, {m, D});
    cuda_ops::GatherRows(F(x), I32(ri), m, D, F(xs), ctx_->stream);
    Tensor g = Temp(DType::kF32, {m, I}), u = Temp(DType::kF32, {m, I}), y = Temp(DType::kF32, {m, D});
    Linear(xs, e.w1, &g);
    Linear(xs, e.w3, &u);
    cuda_ops::SwiGlu(F(g), F(u), m * I, limit, ctx_->stream);
    Linear(g, e.w2, &y);
    cuda_ops::ScatterAddRows(F(y), I32(ri), F(wv), m, D, F(*out), ctx_->stream);
    Launched("MoeExperts (per expert)");
  }

  std::shared_ptr<StreamContext> ctx_;
  CudaBackendOptions options_;
  std::string name_;
  // The step's scratch arena and metadata (BeginStep); graphs by segment key.
  void* arena_ = nullptr;
  size_t arena_bytes_ = 0, arena_top_ = 0;
  bool in_step_ = false, capturing_ = false, logged_overflow_ = false, logged_graphs_ = false,
       logged_capture_failure_ = false;
  const int32_t* step_tokens_ = nullptr;
  const int64_t* step_positions_ = nullptr;
  const int32_t* step_tables_ = nullptr;
  int64_t step_tables_len_ = 0, step_tables_cap_ = 0;
  void *step_tables_dev_ = nullptr, *step_tables_pinned_ = nullptr;
  int64_t step_n_ = 0;
  void *step_tokens_dev_ = nullptr, *step_positions_dev_ = nullptr, *step_pinned_ = nullptr;
  cudaEvent_t step_uploaded_ = nullptr;
  const int32_t* step_tokens_on_device_ = nullptr;
  const int64_t* step_positions_on_device_ = nullptr;
  std::vector<Tensor> step_meta_keep_;
  std::unique_ptr<OpProfiler> profiler_;  // on while the bench profiles
  std::map<SegmentKey, Graph> graphs_;
  // Stateful segments (StatefulSegment): records by (key, the step's key bucket), the mode the backend is
  // in while one runs, and where launch parameters are staged outside records (a pinned ring copied to a
  // device ring in stream order).
  std::map<std::pair<SegmentKey, int64_t>, StatefulGraph> stateful_graphs_;
  StatefulMode stateful_mode_ = StatefulMode::kNone;
  std::string unrecordable_;
  StatefulGraph* staging_graph_ = nullptr;
  Stager stager_{this};
  static constexpr size_t kEagerParamBytes = size_t{4} << 20;
  void* eager_params_host_ = nullptr;
  void* eager_params_dev_ = nullptr;
  size_t eager_params_top_ = 0;
  int64_t step_key_bucket_ = 0;  // BeginStep: the step's largest position + 1, rounded up to a power of two
  bool logged_stateful_graphs_ = false, logged_stateful_failure_ = false, stateful_graphs_on_ = true;
  int64_t max_k_ = 128, max_n_ = 128, max_weights_ = 128 * 128;
  std::unique_ptr<Exl3GemvWorkspace> gemv_ws_;
  struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
    std::unique_ptr<Exl3GemvWorkspace> gemv_ws;
  };
  static constexpr int kSideStreams = 8;
  std::vector<SideStream> side_;  // created on first use (Concurrently)
  cudaEvent_t fork_ = nullptr;
  std::unique_ptr<Exl3GemmWorkspace> gemm_ws_;
  int64_t gemm_ws_k_ = 0, gemm_ws_n_ = 0, gemm_ws_weights_ = 0;
  bool logged_many_rows_ = false;
  bool logged_gemv_batch_ = false;
  bool prefill_moe_per_expert_ = false, prefill_moe_row_slices_ = false;
  enum class PrefillAttention { kMma, kMmaFp16, kSplit, kPerRow };
  PrefillAttention prefill_attention_ = PrefillAttention::kMma;  // DSMESH_CUDA_PREFILL_ATTENTION
  bool logged_prefill_attention_ = false;
  bool logged_sorted_pairs_ = false;
  std::unique_ptr<Exl3MoeWorkspace> sorted_ws_;  // MoeExpertsSortedPairs' (grown to the largest chunk)
  DenseGemm dense_gemm_;  // cuBLAS for dense linears of more than kGraphMaxRows rows
  std::set<std::string> logged_fallback_;  // ops whose fallback (per sequence, or composed of other ops) was logged
  bool logged_serial_linears_ = false;  // concurrent linears requested but run in order was logged
  std::mutex cache_mu_, moe_mu_;
  std::map<std::pair<const void*, size_t>, CachedCopy> host_cache_;
  std::set<const void*> device_tables_;  // routing tables already in device memory
  // Keyed by the experts vector (it lives as long as the model's weights), top-k and clamp limit.
  std::map<std::tuple<const void*, int, float>, std::unique_ptr<FusedMoe>> fused_;
};

}  // namespace

int ParseDeviceFlag(const std::string& value, const std::string& flag) {
  if (value == "cpu") return -1;
  if (value == "cuda") return 0;
  if (value.rfind("cuda:", 0) == 0) {
    const std::string n = value.substr(5);
    if (!n.empty() && n.size() < 4 && n.find_first_not_of("0123456789") == std::string::npos) return std::stoi(n);
  }
  throw std::runtime_error(flag + " " + value + ": expected cpu, cuda or cuda:N");
}

std::shared_ptr<Backend> MakeCudaBackend(int device, const CudaBackendOptions& options) {
  RequireCudaDevice(device, "the CUDA backend");
  return std::make_shared<CudaBackend>(device, options);
}

void* CudaBackendStream(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda ? cuda->stream() : nullptr;
}

CudaGraphCounts CudaGraphCallCounts() {
  return {g_graph_captures.load(),    g_graph_replays.load(),    g_graph_failures.load(),
          g_eager_segments.load(),    g_scratch_overflows.load(), g_stateful_captures.load(),
          g_stateful_replays.load(),  g_stateful_failures.load(), g_replayed_nodes.load()};
}

CudaMoePathCounts CudaMoePathCallCounts() { return {g_fused_moe.load(), g_per_expert_moe.load()}; }
CudaGemvBatchCounts CudaGemvBatchCallCounts() { return {g_gemv_batches.load(), g_gemv_batched_linears.load()}; }
int64_t CudaPerSequenceFallbacks() { return g_per_sequence_fallbacks.load(); }

}  // namespace dsmesh

#include "kernels/cuda/cuda_step_arena.h"

#include <cstdio>
#include <cstring>

#include "kernels/kv_rows.h"

namespace dsmesh {
namespace {

// Rows whose metadata the fixed step buffers hold (bigger steps copy theirs into scratch).
constexpr int64_t kStepBufferRows = 64;
constexpr size_t kScratchAlign = 256;

}  // namespace

StepArena::StepArena(std::shared_ptr<StreamContext> ctx, size_t scratch_bytes, CudaBackendCounters& counters)
    : ctx_(std::move(ctx)), counters_(counters) {
  arena_bytes_ = scratch_bytes / kScratchAlign * kScratchAlign;
  if (arena_bytes_ > 0)
    CudaCheck(cudaMalloc(&arena_, arena_bytes_), "cudaMalloc of the " + std::to_string(arena_bytes_ >> 20) +
                                                     " MiB scratch arena");
  CudaCheck(cudaMalloc(&step_tokens_dev_, kStepBufferRows * sizeof(int32_t)), "cudaMalloc for step tokens");
  CudaCheck(cudaMalloc(&step_positions_dev_, kStepBufferRows * sizeof(int64_t)), "cudaMalloc for step positions");
  CudaCheck(cudaMallocHost(&step_pinned_, kStepBufferRows * (sizeof(int32_t) + sizeof(int64_t))),
            "cudaMallocHost for step metadata");
  CudaCheck(cudaEventCreateWithFlags(&step_uploaded_, cudaEventDisableTiming), "cudaEventCreate");
}

StepArena::~StepArena() {
  cudaFreeHost(eager_params_host_);
  cudaFree(eager_params_dev_);
  cudaFree(arena_);
  cudaFree(step_tables_dev_);
  cudaFreeHost(step_tables_pinned_);
  cudaFree(step_tokens_dev_);
  cudaFree(step_positions_dev_);
  cudaFreeHost(step_pinned_);
  cudaEventDestroy(step_uploaded_);
}

void StepArena::Begin(const Backend::StepMetadata& step) {
  const int32_t* tokens = step.tokens;
  const int64_t* positions = step.positions;
  const int64_t n = step.n;
  in_step_ = true;
  arena_top_ = 0;
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

void StepArena::End() {
  in_step_ = false;
  arena_top_ = 0;
  step_tables_ = nullptr;
  step_tables_len_ = 0;
  step_tokens_ = nullptr;
  step_positions_ = nullptr;
  step_n_ = 0;
  step_meta_keep_.clear();
}

Tensor StepArena::Temp(DType dtype, std::vector<int64_t> shape) {
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
    ++counters_.scratch_overflows;
    if (!logged_overflow_) {
      std::fprintf(stderr, "[cuda] a step needs more than the %zu MiB scratch arena; the rest comes from cudaMallocAsync\n",
                   arena_bytes_ >> 20);
      logged_overflow_ = true;
    }
  }
  ctx_->Use();
  return PoolAlloc(ctx_, t.dtype, t.shape);
}

cuda_ops::PagedRowsDev StepArena::Paged(const PagedRows& p, int64_t rows, int64_t dim, Tensor* keep) {
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

template <class T>
const T* StepArena::StepMeta(const T* host, int64_t n, const T* step_host, int64_t step_len, const T* step_device,
                             Tensor* keep) {
  if (in_step_ && step_host && host >= step_host && host + n <= step_host + step_len)
    return step_device + (host - step_host);
  *keep = Staged(host, n);
  return static_cast<const T*>(keep->data);
}
const int32_t* StepArena::StepTokens(const int32_t* host, int64_t n, Tensor* keep) {
  return StepMeta(host, n, step_tokens_, step_n_, step_tokens_on_device_, keep);
}
const int64_t* StepArena::StepPositions(const int64_t* host, int64_t n, Tensor* keep) {
  return StepMeta(host, n, step_positions_, step_n_, step_positions_on_device_, keep);
}
const int32_t* StepArena::StepTables(const int32_t* host, int64_t n, Tensor* keep) {
  return StepMeta(host, n, step_tables_, step_tables_len_, static_cast<const int32_t*>(step_tables_dev_), keep);
}

// The step's block tables into their own device buffer (not the arena, whose offsets the graphs
// check), through a pinned copy; both grow as tables do. Called after the previous upload finished.
void StepArena::UploadTables(const int32_t* tables, int64_t len) {
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

void StepArena::Unrecordable(const char* op, const char* why) {
  if (stateful_mode_ == StatefulMode::kNone) return;
  const std::string what = std::string(op) + ": " + why;
  if (stateful_mode_ == StatefulMode::kProbing) {
    if (unrecordable_.empty()) unrecordable_ = what;
    return;
  }
  throw std::runtime_error("cuda backend: " + what + " inside a recorded stateful segment");
}

StepArena::StagingInto::StagingInto(StepArena* arena, StagedParams* params, StatefulMode mode) : arena_(arena) {
  arena_->staging_ = params;
  params->used = 0;
  params->shapes_seen = 0;
  arena_->stateful_mode_ = mode;
}

StepArena::StagingInto::~StagingInto() {
  arena_->staging_ = nullptr;
  arena_->stateful_mode_ = StatefulMode::kNone;
}

const void* StepArena::StageParams(const void* host, size_t bytes) {
  const size_t size = (bytes + 15) / 16 * 16;
  if (staging_) {
    StagedParams& g = *staging_;
    if (g.used + size > StagedParams::kBytes)
      throw std::runtime_error("a stateful segment stages more than " + std::to_string(StagedParams::kBytes >> 10) +
                               " KiB of launch parameters");
    std::memcpy(static_cast<char*>(g.host) + g.used, host, bytes);
    const void* dev = static_cast<char*>(g.dev) + g.used;
    g.used += size;
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

int64_t StepArena::IndexerKeysLd(int64_t n, int64_t max_keys, int ratio) const {
  if (in_step_ && n <= kGraphMaxRows && step_n_ <= kGraphMaxRows && step_key_bucket_ > 0 && ratio > 0)
    return std::max(max_keys, step_key_bucket_ / ratio);
  return max_keys;
}

int64_t StepArena::LaunchShape(int64_t v) {
  if (!staging_) return v;
  StagedParams& g = *staging_;
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

}  // namespace dsmesh

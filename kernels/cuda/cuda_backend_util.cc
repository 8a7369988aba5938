#include "kernels/cuda/cuda_backend_util.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"

namespace dsmesh {

void CheckLaunch(const char* op) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("cuda backend ") + op + ": launch failed: " +
                                                 cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

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

StreamContext::StreamContext(int d) : device(d) {
  CudaCheck(cudaSetDevice(d), "cudaSetDevice(" + std::to_string(d) + ")");
  CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

StreamContext::~StreamContext() {
  cudaSetDevice(device);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}

void StreamContext::Use() const { CudaCheck(cudaSetDevice(device), "cudaSetDevice"); }

Tensor PoolAlloc(const std::shared_ptr<StreamContext>& ctx, DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t bytes = std::max<size_t>(t.nbytes(), 16);
  void* p = nullptr;
  CudaCheck(cudaMallocAsync(&p, bytes, ctx->stream), "cudaMallocAsync of " + std::to_string(bytes) + " bytes");
  CudaCheck(cudaMemsetAsync(p, 0, bytes, ctx->stream), "cudaMemsetAsync");
  t.data = p;
  t.owner = std::shared_ptr<void>(p, [ctx](void* q) {
    cudaSetDevice(ctx->device);
    cudaFreeAsync(q, ctx->stream);
  });
  return t;
}

Tensor UploadToDevice(int device, const Tensor& host) {
  Tensor t = host;
  const size_t bytes = std::max<size_t>(host.nbytes(), 16);
  void* p = nullptr;
  CudaCheck(cudaMalloc(&p, bytes), "cudaMalloc of " + std::to_string(bytes) + " bytes for a weight " +
                                       host.ShapeString());
  if (host.nbytes() > 0) CudaCheck(cudaMemcpy(p, host.data, host.nbytes(), cudaMemcpyHostToDevice), "weight upload");
  t.data = p;
  t.owner = std::shared_ptr<void>(p, [device](void* q) {
    cudaSetDevice(device);
    cudaFree(q);
  });
  return t;
}

CudaBackendStatistics CudaBackendCounters::Snapshot() const {
  CudaBackendStatistics s;
  s.graphs = {graph_captures.load(),   graph_replays.load(),     graph_failures.load(),
              eager_segments.load(),   scratch_overflows.load(), stateful_captures.load(),
              stateful_replays.load(), stateful_failures.load(), replayed_nodes.load()};
  s.moe = {fused_moe.load(), per_expert_moe.load()};
  s.gemv_batches = {gemv_batches.load(), gemv_batched_linears.load()};
  s.per_sequence_fallbacks = per_sequence_fallbacks.load();
  s.pdl_launches = pdl_launches.load();
  s.host = {steps.load(),           step_wall_ns.load() / 1e6,        step_sync_wait_ns.load() / 1e6,
            host_graph_launches.load(), host_graph_launch_ns.load() / 1e6, host_stateful_ops_ns.load() / 1e6};
  return s;
}

}  // namespace dsmesh

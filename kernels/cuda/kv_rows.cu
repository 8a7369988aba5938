// The device twin of kernels/kv_rows.cc's EncodeKvRows: the state pool's bf16 and fp8 rows written where a
// compressor emits them, so that a device pool never passes through the host.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_rows_device.cuh"
#include "kernels/cuda/model_ops_device.cuh"
#include "kernels/cuda/model_ops.h"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kEncodeThreads = 128;

// One block per row. fp8: the block's largest |value| over the nope part gives the scale (max is exact
// whatever the order, so the scale equals the CPU's bit for bit), then each value / scale is rounded.
__global__ void __launch_bounds__(kEncodeThreads) EncodeKvRowsKernel(const float* src, int64_t dim, int64_t rope_dim,
                                                                     RowKind kind, int64_t row_bytes, uint8_t* dst) {
  const float* x = src + blockIdx.x * dim;
  uint8_t* out = dst + blockIdx.x * row_bytes;
  if (kind == RowKind::kBF16) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const uint16_t b = FloatToBf16Bits(x[i]);
      out[2 * i] = static_cast<uint8_t>(b & 0xff);
      out[2 * i + 1] = static_cast<uint8_t>(b >> 8);
    }
    return;
  }
  const int64_t nope = dim - rope_dim;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < nope; i += blockDim.x) amax = fmaxf(amax, fabsf(x[i]));
  amax = BlockReduce<true>(amax);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  for (int64_t i = threadIdx.x; i < nope; i += blockDim.x) out[i] = FloatToFp8E4M3Bits(x[i] / scale);
  if (threadIdx.x < 4) out[nope + threadIdx.x] = static_cast<uint8_t>(__float_as_uint(scale) >> (8 * threadIdx.x));
  for (int64_t i = threadIdx.x; i < rope_dim; i += blockDim.x) {
    const uint16_t b = FloatToBf16Bits(x[nope + i]);
    out[nope + 4 + 2 * i] = static_cast<uint8_t>(b & 0xff);
    out[nope + 4 + 2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
}

}  // namespace

void EncodeKvRows(const float* src, int64_t rows, int64_t dim, int64_t rope_dim, RowKind kind, int64_t row_bytes,
                  void* dst, cudaStream_t s) {
  if (rows <= 0) return;
  if (kind == RowKind::kF32) {
    CudaCheck(cudaMemcpyAsync(dst, src, static_cast<size_t>(rows * row_bytes), cudaMemcpyDeviceToDevice, s),
              "EncodeKvRows copy");
    return;
  }
  EncodeKvRowsKernel<<<static_cast<unsigned>(rows), kEncodeThreads, 0, s>>>(src, dim, rope_dim, kind, row_bytes,
                                                                          static_cast<uint8_t*>(dst));
}

}  // namespace dsmesh::cuda_ops

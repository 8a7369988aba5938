// The device twin of kernels/kv_rows.cc's EncodeKvRows: the state pool's bf16 and fp8 rows written where a
// compressor emits them, so that a device pool never passes through the host.
// Every kernel here is launched through PdlLaunch (pdl_launch.cuh) and starts with PdlWait() (it reads
// the previous kernels' output from its first load on; its prologue is index math only) and then
// PdlTrigger(), so that with programmatic dependent launch the next kernel's launch overlaps all of it.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_rows_device.cuh"
#include "kernels/cuda/model_ops_device.cuh"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/pdl_launch.cuh"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kEncodeThreads = 128;

// One block per row (BlockEncodeKvRow).
__global__ void __launch_bounds__(kEncodeThreads) EncodeKvRowsKernel(const float* src, int64_t dim, int64_t rope_dim,
                                                                     RowKind kind, int64_t row_bytes, uint8_t* dst) {
  PdlWait();
  PdlTrigger();
  BlockEncodeKvRow(src + blockIdx.x * dim, dim, dim - rope_dim, kind, dst + blockIdx.x * row_bytes);
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
  PdlLaunch(EncodeKvRowsKernel, static_cast<unsigned>(rows), kEncodeThreads, 0, s, src, dim, rope_dim, kind, row_bytes,
            static_cast<uint8_t*>(dst));
}

}  // namespace dsmesh::cuda_ops

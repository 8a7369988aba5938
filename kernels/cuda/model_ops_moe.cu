// Routed experts of a prefill chunk as (row, expert) pairs grouped by expert: the routing sorted on the
// device, the pairs' inputs gathered in that order, and their outputs summed back into the rows. The
// routed-expert kernel (exl3_moe.h, Exl3MoeForwardSorted) then runs all pairs in one launch, decoding
// each expert's weights once per 16 of its pairs, where slices of 24 whole rows (24 x 6 slots hit ~110
// experts) decode most experts again in every slice.
// CPU twin: CpuBackend::MoeExperts (the same sums, each pair's expert output scaled by its routing weight).
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/model_ops_device.cuh"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kSortThreads = 1024;

// One block. Bucket b < E holds the pairs routed to expert b in pair order; bucket E the pairs whose id
// is out of range (sorted last, id -1: the MoE kernel flags them and gives them no output). Counting and
// placing both walk the pairs 32 at a time per bucket with a warp ballot, so the order inside a bucket is
// the pairs' order (stable, no atomics: the same routing always gives the same layout).
__global__ void __launch_bounds__(kSortThreads) SortPairsKernel(const int32_t* ids, const float* weights, int P, int k,
                                                                int E, int32_t* sorted_ids, float* sorted_w,
                                                                int32_t* src_row, int32_t* pos) {
  extern __shared__ uint16_t bucket[];  // [P]
  __shared__ int base[kMoeSortMaxExperts + 2];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = kSortThreads / 32;
  for (int i = tid; i < P; i += kSortThreads) {
    const int v = ids[i];
    bucket[i] = static_cast<uint16_t>(v >= 0 && v < E ? v : E);
  }
  __syncthreads();
  for (int b = warp; b <= E; b += warps) {
    int c = 0;
    for (int i0 = 0; i0 < P; i0 += 32) c += __popc(__ballot_sync(0xFFFFFFFFu, i0 + lane < P && bucket[i0 + lane] == b));
    if (lane == 0) base[b + 1] = c;
  }
  __syncthreads();
  if (tid == 0) {
    base[0] = 0;
    for (int b = 1; b <= E + 1; ++b) base[b] += base[b - 1];
  }
  __syncthreads();
  for (int b = warp; b <= E; b += warps) {
    int off = base[b];
    for (int i0 = 0; i0 < P; i0 += 32) {
      const int i = i0 + lane;
      const bool mine = i < P && bucket[i] == b;
      const uint32_t m = __ballot_sync(0xFFFFFFFFu, mine);
      if (mine) {
        const int p = off + __popc(m & ((1u << lane) - 1u));
        sorted_ids[p] = b < E ? b : -1;
        sorted_w[p] = weights[i];
        src_row[p] = i / k;
        pos[i] = p;
      }
      off += __popc(m);
    }
  }
}

// xh[p, :] = fp16(x[src_row[p], :]), four columns per thread (width % 4 == 0).
__global__ void GatherRowsToHalfKernel(const float* x, int64_t width, const int32_t* src_row, int64_t P,
                                       uint16_t* xh) {
  const int64_t quads = width / 4;
  for (int64_t p = blockIdx.y; p < P; p += gridDim.y) {
    const float4* src = reinterpret_cast<const float4*>(x + src_row[p] * width);
    uint2* dst = reinterpret_cast<uint2*>(xh + p * width);
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < quads; q += (int64_t)gridDim.x * blockDim.x) {
      const float4 v = src[q];
      const half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
      dst[q] = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
    }
  }
}

// out[r, :] += sum over slots j = 0..k-1, in that order, of y[pos[r * k + j], :] (pairs whose sorted id is
// -1, routed out of range, add nothing).
__global__ void AddPairsToRowsKernel(const float* y, const int32_t* pos, const int32_t* sorted_ids, int64_t n, int k,
                                     int64_t width, float* out) {
  const int64_t quads = width / 4;
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y)
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < quads; q += (int64_t)gridDim.x * blockDim.x) {
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int j = 0; j < k; ++j) {
        const int64_t p = pos[r * k + j];
        if (sorted_ids[p] < 0) continue;
        const float4 v = reinterpret_cast<const float4*>(y + p * width)[q];
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      float4* o = reinterpret_cast<float4*>(out + r * width) + q;
      float4 a = *o;
      a.x += s.x;
      a.y += s.y;
      a.z += s.z;
      a.w += s.w;
      *o = a;
    }
}

unsigned GridRows(int64_t rows) { return static_cast<unsigned>(rows < 65535 ? rows : 65535); }

}  // namespace

void SortPairsByExpert(const int32_t* ids, const float* weights, int64_t n, int k, int num_experts,
                       int32_t* sorted_ids, float* sorted_w, int32_t* src_row, int32_t* pos, cudaStream_t s) {
  const int64_t P = n * k;
  if (P <= 0) return;
  if (P > kMoeSortMaxPairs || num_experts < 1 || num_experts > kMoeSortMaxExperts)
    throw std::runtime_error("cuda SortPairsByExpert: " + std::to_string(P) + " pairs / " +
                             std::to_string(num_experts) + " experts (at most " + std::to_string(kMoeSortMaxPairs) +
                             " / " + std::to_string(kMoeSortMaxExperts) + ")");
  const size_t smem = static_cast<size_t>(P) * sizeof(uint16_t);
  static PerDeviceOnce once;  // the dynamic shared memory limit, raised for the largest P (outside any capture)
  once.Run([](int) {
    CudaCheck(cudaFuncSetAttribute(SortPairsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(kMoeSortMaxPairs * sizeof(uint16_t))),
              "SortPairsByExpert shared memory");
  });
  SortPairsKernel<<<1, kSortThreads, smem, s>>>(ids, weights, static_cast<int>(P), k, num_experts, sorted_ids,
                                                 sorted_w, src_row, pos);
}

void GatherRowsToHalf(const float* x, int64_t width, const int32_t* src_row, int64_t P, uint16_t* xh, cudaStream_t s) {
  if (P <= 0) return;
  const int64_t quads = width / 4;
  const unsigned bx = static_cast<unsigned>((quads + 255) / 256);
  GatherRowsToHalfKernel<<<dim3(bx, GridRows(P)), 256, 0, s>>>(x, width, src_row, P, xh);
}

void AddPairsToRows(const float* y, const int32_t* pos, const int32_t* sorted_ids, int64_t n, int k, int64_t width,
                    float* out, cudaStream_t s) {
  if (n <= 0) return;
  const int64_t quads = width / 4;
  const unsigned bx = static_cast<unsigned>((quads + 255) / 256);
  AddPairsToRowsKernel<<<dim3(bx, GridRows(n)), 256, 0, s>>>(y, pos, sorted_ids, n, k, width, out);
}

}  // namespace dsmesh::cuda_ops

// Launch parameters of the dense EXL3 GEMV kernel (plain struct shared by host and device code).
#pragma once

#include <cstdint>

namespace dsmesh::exl3cuda {

struct GemvParams {
  const uint16_t* x;        // fp16 [m, k], row-major
  const uint16_t* trellis;  // int16 [k/16, n/16, 16K]
  const uint16_t* suh;      // fp16 [k]
  const uint16_t* svh;      // fp16 [n]
  void* y;                  // [m, n], fp32 or fp16 (y_fp16)
  float* partial;           // [splits, m, n] fp32 split-K partial sums (splits > 1)
  int* counters;            // [n / 128] arrival counters, zero between launches (splits > 1)
  int m, k, n;
  int splits;               // k is cut into `splits` ranges of whole 128-blocks, at most 8 blocks each
  int y_fp16;               // 1: y is fp16, 0: fp32
  int y_accumulate;         // 1: y (fp32) += the result, 0: y = the result
  uint32_t one;             // always 1; a runtime value so shifts by it compile to IMADs (exl3_device.cuh)
};

// One launch of the GEMV kernel over up to kMaxJobs linears of the same K, codebook, k, m and output type
// (a layer's projections of one input, the groups of a grouped projection): job j owns the CTA columns
// blockIdx.x in [strip_begin[j], strip_begin[j] + n_j / 128); every job is cut into the same `splits`.
// A single linear is a batch of one. Passed as a __grid_constant__ kernel parameter: nothing is uploaded.
struct GemvBatch {
  static constexpr int kMaxJobs = 8;
  GemvParams job[kMaxJobs];
  int strip_begin[kMaxJobs];
  int jobs;
};

// Pipeline depth per K: 28-40 KB of trellis per CTA (64 tiles per stage), so that three CTAs fit on
// an SM with their activations (K >= 7 keeps only one stage in flight).
constexpr int StagesForK(int K) {
  return K <= 1 ? 16 : K == 2 ? 8 : K == 3 ? 6 : K == 4 ? 5 : K == 5 ? 4 : K == 6 ? 3 : 2;
}
constexpr int StageBytes(int K) { return 64 * 32 * K; }
// The ring doubles as the k-split reduction scratch, which needs 32 KB (8 warps x 16 rows x 64 fp32).
constexpr int RingBytes(int K) {
  return StagesForK(K) * StageBytes(K) > 32768 ? StagesForK(K) * StageBytes(K) : 32768;
}

constexpr int kGemvMaxBlocksPerSplit = 8;  // 1024 input channels per CTA
constexpr int kGemvAStride = kGemvMaxBlocksPerSplit * 128 + 8;  // fp16 per activation row (padded)
constexpr int kGemvABytes = 16 * kGemvAStride * 2;
// Shared memory of the dense kernel for bits-per-weight K: the trellis ring plus 16 activation rows.
constexpr int GemvSmemBytes(int K) { return RingBytes(K) + kGemvABytes; }

// One function per codebook (separate translation units keep nvcc's parallelism and memory in check).
// Returns the launch error, if any; prepare sets the kernels' dynamic shared memory limit once.
// grid_x is the batch's total strips, grid_y its splits.
int LaunchGemv3Inst(int K, const GemvBatch& b, int grid_x, int grid_y, void* stream);
int LaunchGemvMcg(int K, const GemvBatch& b, int grid_x, int grid_y, void* stream);
int LaunchGemvMul1(int K, const GemvBatch& b, int grid_x, int grid_y, void* stream);
// Ŵ reconstruction (k x n fp16, row-major), optionally fused with the prefill GEMM's input transform
// xh[m, k] = Hk(x * suh) (fp16), done by `m * k / 1024` extra CTAs in the same launch.
struct ReconstructParams {
  const uint16_t* trellis;  // int16 [k/16, n/16, 16K]
  uint16_t* what;           // fp16 [k, n], 16-byte aligned
  int k, n;                 // multiples of 16 (k of 128 when the input transform is fused)
  uint32_t one;             // always 1 (see GemvParams)
  const uint16_t* x;        // fp16 [m, k] or null (no input transform)
  const uint16_t* suh;      // fp16 [k]
  uint16_t* xh;             // fp16 [m, k]
  int m;
};
int LaunchReconstruct3Inst(int K, const ReconstructParams& p, void* stream);
int LaunchReconstructMcg(int K, const ReconstructParams& p, void* stream);
int LaunchReconstructMul1(int K, const ReconstructParams& p, void* stream);
inline int LaunchReconstruct(int K, int codebook, const ReconstructParams& p, void* stream) {
  return codebook == 0 ? LaunchReconstruct3Inst(K, p, stream)
         : codebook == 1 ? LaunchReconstructMcg(K, p, stream)
                         : LaunchReconstructMul1(K, p, stream);
}
int PrepareGemv3Inst();
int PrepareGemvMcg();
int PrepareGemvMul1();

}  // namespace dsmesh::exl3cuda

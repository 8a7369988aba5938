// Launch of the prefill GEMM's one custom kernel (exl3_gemm_kernels.cu), shared by exl3_gemm.cc, the
// GEMM test and dsmesh-kernel-bench. Plain struct, no CUDA types: host C++ includes it.
//
// The kernel writes the "effective" weight W_eff = Ŵ Hn diag(svh) (fp16, [k, n] row-major), i.e. the
// trellis-decoded Ŵ with the output Hadamard (128-point, over each 128-column block of n, scale
// 1/sqrt(128)) and the output scale svh already applied to its rows. Then y = xh W_eff directly, with
// xh = Hk(x * suh): since y = (xh Ŵ) Hn diag(svh) = xh (Ŵ Hn diag(svh)), cuBLAS writes y itself and no
// output-transform pass over an fp32 intermediate is needed.
#pragma once

#include <cstdint>

namespace dsmesh::exl3cuda {

struct GemmWeightParams {
  const uint16_t* trellis;  // int16 [k/16, n/16, 16K], 16-byte aligned
  const uint16_t* svh;      // fp16 [n], 8-byte aligned
  uint16_t* weff;           // fp16 [k, n], 16-byte aligned (written)
  int k, n;                 // multiples of 128
  uint32_t one;             // always 1 (a runtime value so shifts by it compile to IMADs, exl3_device.cuh)
  // Saturation counter (device, may be null): the kernel adds the number of W_eff elements whose fp32
  // value rounds to +-inf (or is NaN) in fp16. It is only evaluated for 128-column blocks where some |svh| could
  // make that possible (|svh| > kWeffSafeSvh); otherwise overflow is impossible and nothing is checked.
  unsigned int* saturated;
  // Fused input transform, xh[m, k] = Hk(x * suh) (fp16), done by extra CTAs of the same launch;
  // x = null skips it.
  const uint16_t* x;    // fp16 [m, k]
  const uint16_t* suh;  // fp16 [k]
  uint16_t* xh;         // fp16 [m, k]
  int m;
};

// |Ŵ| < 4 for every codebook (two fp16 halves of magnitude < 2 summed; MUL1 spans -3.46..3.44), so a
// 128-point Hadamard with scale 1/sqrt(128) keeps |Ŵ Hn| <= 128 * 4 / sqrt(128) = 45.26, and with
// |svh| <= 1447 every |W_eff| stays below 65504 (fp16 max). Real EXL3 svh are column RMS / mean
// column RMS (docs/exl3-format.md §2.6), i.e. O(1); larger ones switch the kernel's overflow count on.
constexpr float kWeffSafeSvh = 1447.0f;

// Returns the launch error, if any (cudaSuccess = 0). K = 1..8, codebook 0..2 (3INST, MCG, MUL1).
int LaunchGemmWeight(int K, int codebook, const GemmWeightParams& p, void* stream);

}  // namespace dsmesh::exl3cuda

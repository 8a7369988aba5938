// The integer work of decoding EXL3 weights on the GPU, for decode-op floors: instructions on the integer
// pipe (LOP3, SHF, PRMT, IADD3, LEA, ...) per decoded weight in the main loop of the CUDA GEMV/MoE
// kernels, counted in their sm_90 SASS by kernels/cuda/sass_loop_ops.py (one main-loop iteration = 8
// tiles = 64 weights per lane; docs/cuda-kernels.md has the method and the FMA-pipe counts). Up to 8
// rows the kernels run the few-rows form (unpacked, transposed MMA), more rows the packed one. The
// integer pipe is the busier of the two pipes (FMA: IMAD ~1.8-2.0 per weight in the few-rows loop), so
// this count over the measured LOP3 rate is the floor.
#pragma once

namespace dsmesh {

inline double Exl3DecodeOpsPerWeight(int K, int rows) {
  static const double kFew[9] = {0, 2.48, 2.48, 2.66, 2.70, 2.80, 3.06, 3.11, 2.98};
  static const double kPacked[9] = {0, 3.06, 3.05, 3.23, 3.28, 3.41, 3.64, 3.69, 3.58};
  const int k = K < 1 ? 1 : K > 8 ? 8 : K;
  return rows <= 8 ? kFew[k] : kPacked[k];
}

}  // namespace dsmesh

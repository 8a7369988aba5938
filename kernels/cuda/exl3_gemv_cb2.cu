// Dense EXL3 GEMV kernels for the Mul1 codebook, K = 1..8 (see exl3_gemv_kernel.cuh).
#include "kernels/cuda/exl3_gemv_kernel.cuh"

namespace dsmesh::exl3cuda {
DSMESH_EXL3_GEMV_CODEBOOK(2, Mul1)
}  // namespace dsmesh::exl3cuda

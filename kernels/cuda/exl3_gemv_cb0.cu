// Dense EXL3 GEMV kernels for the 3Inst codebook, K = 1..8 (see exl3_gemv_kernel.cuh).
#include "kernels/cuda/exl3_gemv_kernel.cuh"

namespace dsmesh::exl3cuda {
DSMESH_EXL3_GEMV_CODEBOOK(0, 3Inst)
}  // namespace dsmesh::exl3cuda

#include "kernels/cuda/dense_gemm.h"

#include <cublas_v2.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace dsmesh {
namespace {

constexpr size_t kCublasScratchBytes = size_t{32} << 20;

void CublasCheck(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(what + ": cuBLAS error " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

}  // namespace

DenseGemm::~DenseGemm() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  cudaFree(scratch_);
}

bool DenseGemm::Run(const float* x, int64_t ldx, int64_t m, const void* w, cuda_ops::WType type, int64_t n, int64_t k,
                    float* w_scratch, float* out, int64_t ldo, cudaStream_t stream) {
  if (!Takes(type, n, k) || m <= 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!handle_) {
    cublasHandle_t h = nullptr;
    CublasCheck(cublasCreate(&h), "DenseGemm cublasCreate");
    handle_ = h;
    CudaCheck(cudaMalloc(&scratch_, kCublasScratchBytes), "DenseGemm cuBLAS scratch");
    CublasCheck(cublasSetWorkspace(h, scratch_, kCublasScratchBytes), "DenseGemm cublasSetWorkspace");
    std::fprintf(stderr, "[cuda] dense linears of more than 16 rows with bf16/fp16 weights: cuBLAS SGEMM on the "
                         "weights widened to fp32\n");
  }
  cuda_ops::WidenToF32(w, type, n * k, w_scratch, stream);
  auto h = static_cast<cublasHandle_t>(handle_);
  CublasCheck(cublasSetStream(h, stream), "DenseGemm cublasSetStream");
  // Column-major view: out^T [n x m] = (W as col-major [k x n])^T x^T [k x m].
  const float one = 1.0f, zero = 0.0f;
  CublasCheck(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                          &one, w_scratch, static_cast<int>(k), x, static_cast<int>(ldx), &zero, out,
                          static_cast<int>(ldo)),
              "DenseGemm cublasSgemm");
  return true;
}

}  // namespace dsmesh

#include "kernels/cuda/exl3_gemm.h"

#include <cublas_v2.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/exl3_gemm_kernels.h"

namespace dsmesh {
namespace {

constexpr size_t kCublasScratchBytes = size_t(32) << 20;  // NVIDIA's recommendation for Hopper

void CublasCheck(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(what + ": cuBLAS error " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

}  // namespace

Exl3GemmWorkspace::Exl3GemmWorkspace(int max_m, int64_t max_k, int64_t max_n, int64_t max_weights)
    : max_m_(max_m), max_k_(max_k), max_n_(max_n), max_weights_(max_weights) {
  if (max_m < 1 || max_k < 128 || max_n < 128 || max_weights < 128 * 128)
    throw std::runtime_error("Exl3GemmWorkspace: bad limits m " + std::to_string(max_m) + ", k " +
                             std::to_string(max_k) + ", n " + std::to_string(max_n) + ", weights " +
                             std::to_string(max_weights));
  CudaCheck(cudaGetDevice(&device_), "cudaGetDevice");
  cublasHandle_t h = nullptr;
  CublasCheck(cublasCreate(&h), "Exl3GemmWorkspace cublasCreate");
  cublas_ = h;
  CudaCheck(cudaMalloc(&cublas_scratch_, kCublasScratchBytes), "Exl3GemmWorkspace cuBLAS scratch");
  CudaCheck(cudaMalloc(&weff_, static_cast<size_t>(max_weights) * 2), "Exl3GemmWorkspace weight scratch");
  CudaCheck(cudaMalloc(&xh_, static_cast<size_t>(max_m) * max_k * 2), "Exl3GemmWorkspace activation scratch");
  CudaCheck(cudaMalloc(&saturated_, sizeof(unsigned int)), "Exl3GemmWorkspace saturation counter");
  CudaCheck(cudaMemset(saturated_, 0, sizeof(unsigned int)), "Exl3GemmWorkspace saturation counter");
}

Exl3GemmWorkspace::~Exl3GemmWorkspace() {
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  cudaFree(cublas_scratch_);
  cudaFree(weff_);
  cudaFree(xh_);
  cudaFree(saturated_);
}

uint64_t Exl3GemmWorkspace::SaturatedWeights() const {
  unsigned int n = 0;
  CudaCheck(cudaMemcpy(&n, saturated_, sizeof(n), cudaMemcpyDeviceToHost), "Exl3GemmWorkspace saturation counter read");
  return n;
}

void Exl3Gemm(const Exl3DeviceLinear& w, const uint16_t* x, int m, void* y, Exl3Out out, Exl3GemmWorkspace& ws,
              cudaStream_t stream) {
  const std::string who = "EXL3 GEMM '" + w.name + "'";
  CheckExl3LinearShape(w, who);
  if (m < 1 || m > ws.max_m_)
    throw std::runtime_error(who + ": m = " + std::to_string(m) + " rows (the workspace takes 1.." +
                             std::to_string(ws.max_m_) + ")");
  if (w.k > ws.max_k_ || w.n > ws.max_n_ || w.k * w.n > ws.max_weights_)
    throw std::runtime_error(who + ": " + std::to_string(w.k) + "x" + std::to_string(w.n) +
                             " exceeds the workspace (max k " + std::to_string(ws.max_k_) + ", n " +
                             std::to_string(ws.max_n_) + ", k*n " + std::to_string(ws.max_weights_) + ")");
  CheckExl3LinearCall(w, x, y, ws.device_, who);
  cublasHandle_t h = static_cast<cublasHandle_t>(ws.cublas_);
  if (!ws.bound_) {
    // cublasSetStream resets the handle's workspace to cuBLAS's own pool, so our scratch is set after
    // it; with a user workspace cuBLAS allocates nothing at call time (safe inside graph capture).
    CublasCheck(cublasSetStream(h, stream), who + ": cublasSetStream");
    CublasCheck(cublasSetWorkspace(h, ws.cublas_scratch_, kCublasScratchBytes), who + ": cublasSetWorkspace");
    ws.bound_ = true;
    ws.stream_ = stream;
  } else if (ws.stream_ != stream) {
    throw std::runtime_error(who + ": workspace is bound to another stream; use one Exl3GemmWorkspace per stream");
  }

  exl3cuda::GemmWeightParams p{};
  p.trellis = w.trellis;
  p.svh = w.svh;
  p.weff = ws.weff_;
  p.k = static_cast<int>(w.k);
  p.n = static_cast<int>(w.n);
  p.one = 1;
  p.saturated = ws.saturated_;
  p.x = x;
  p.suh = w.suh;
  p.xh = ws.xh_;
  p.m = m;
  CudaCheck(static_cast<cudaError_t>(exl3cuda::LaunchGemmWeight(w.K, w.codebook, p, stream)),
            who + " weight decode + input transform launch");

  // Row-major y[m, n] = xh[m, k] W_eff[k, n] is, column-major, y^T (n x m) = W_eff^T (n x k) xh^T (k x m).
  const float alpha = 1.0f, beta = 0.0f;
  CublasCheck(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(w.n), m, static_cast<int>(w.k), &alpha,
                           ws.weff_, CUDA_R_16F, static_cast<int>(w.n), ws.xh_, CUDA_R_16F, static_cast<int>(w.k),
                           &beta, y, out == Exl3Out::kF16 ? CUDA_R_16F : CUDA_R_32F, static_cast<int>(w.n),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              who + ": cublasGemmEx");
}

}  // namespace dsmesh

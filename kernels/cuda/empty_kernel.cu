#include "kernels/cuda/empty_kernel.h"

#include <cuda_runtime.h>

namespace dsmesh::cuda_ops {
namespace {

__global__ void EmptyKernel() {}

}  // namespace

const void* EmptyKernelFunction() { return reinterpret_cast<const void*>(&EmptyKernel); }

bool AllowEmptyKernelSharedMemory(int dynamic_smem) {
  if (cudaFuncSetAttribute(EmptyKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_smem) == cudaSuccess)
    return true;
  cudaGetLastError();
  return false;
}

}  // namespace dsmesh::cuda_ops

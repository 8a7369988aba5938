// Turns a CUDA runtime status into a std::runtime_error that says what was being done.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace dsmesh {

inline void CudaCheck(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error(what + ": CUDA error " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace dsmesh

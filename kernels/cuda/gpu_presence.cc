#include "kernels/cuda/gpu_presence.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

namespace dsmesh {

namespace {

std::string VisibleDevicesNote() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (v == nullptr) return "";
  return std::string("; CUDA_VISIBLE_DEVICES is set to \"") + v + "\", which hides every GPU not listed there";
}

std::string CudaVersion(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

}  // namespace

CudaGpus ProbeCudaGpus() {
  CudaGpus g;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) g.cuda_error = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  if (e == cudaSuccess && count > 0) {
    g.count = count;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      g.first_name = prop.name;
      g.first_total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    }
    return g;
  }
  const bool driver_loaded = std::filesystem::exists("/proc/driver/nvidia/version");
  if (e == cudaErrorInsufficientDriver && driver_loaded) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    g.none_reason = "the NVIDIA driver supports CUDA " + CudaVersion(driver) + ", older than this build's CUDA runtime " +
                    CudaVersion(runtime);
    return g;
  }
  g.none_reason = "no CUDA GPU is visible";
  if (!driver_loaded) g.none_reason += ": no NVIDIA driver is loaded on this machine";
  g.none_reason += VisibleDevicesNote();
  return g;
}

void RequireCudaDevice(int index, const std::string& who) {
  const CudaGpus g = ProbeCudaGpus();
  const std::string needs = who + " needs CUDA device " + std::to_string(index);
  const std::string cuda_says = g.cuda_error.empty() ? "" : " (CUDA says " + g.cuda_error + ")";
  if (g.count == 0) {
    const bool old_driver = g.none_reason.rfind("the NVIDIA driver supports", 0) == 0;
    throw std::runtime_error(needs + ", but " + g.none_reason +
                             (old_driver ? "; check the driver version with `nvidia-smi`"
                                         : "; check `nvidia-smi` (it lists the GPUs this machine can use)") +
                             cuda_says);
  }
  if (index < 0 || index >= g.count)
    throw std::runtime_error(needs + ", which is not visible (" + std::to_string(g.count) +
                             " visible, numbered from 0)" + VisibleDevicesNote() + "; check `nvidia-smi`");
}

}  // namespace dsmesh

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

void RequireCudaDevice(int index, const std::string& who) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  const bool driver_loaded = std::filesystem::exists("/proc/driver/nvidia/version");
  const std::string cuda_says =
      e == cudaSuccess ? "" : std::string(" (CUDA says ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")";
  if (e == cudaErrorInsufficientDriver && driver_loaded) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    throw std::runtime_error(who + " needs CUDA device " + std::to_string(index) + ", but the NVIDIA driver supports CUDA " +
                             CudaVersion(driver) +
                             ", older than this build's CUDA runtime " + CudaVersion(runtime) +
                             "; check the driver version with `nvidia-smi`" + cuda_says);
  }
  if (e != cudaSuccess || count == 0) {
    const std::string why = driver_loaded ? "" : ": no NVIDIA driver is loaded on this machine";
    throw std::runtime_error(who + " needs CUDA device " + std::to_string(index) + ", but no CUDA GPU is visible" + why +
                             VisibleDevicesNote() +
                             "; check `nvidia-smi` (it lists the GPUs this machine can use)" + cuda_says);
  }
  if (index < 0 || index >= count)
    throw std::runtime_error(who + " needs CUDA device " + std::to_string(index) + ", which is not visible (" +
                             std::to_string(count) + " visible, numbered from 0)" + VisibleDevicesNote() +
                             "; check `nvidia-smi`");
}

}  // namespace dsmesh

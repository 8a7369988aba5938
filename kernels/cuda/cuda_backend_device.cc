#include "kernels/cuda/cuda_backend_device.h"

#include <cstdio>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl_streams.h"

namespace dsmesh {

BackendDevice::BackendDevice(int device) {
  CudaCheck(cudaGetDeviceProperties(&prop_, device), "cudaGetDeviceProperties");
  name_ = "cuda:" + std::to_string(device) + " (" + prop_.name + ")";
}

void BackendDevice::EnablePdl(cudaStream_t stream, std::atomic<int64_t>* launches) {
  // griddepcontrol and the launch attribute exist from sm_90 on; the build targets sm_90 and sm_120.
  if (prop_.major >= 9) {
    EnablePdlOnStream(stream, launches);
    pdl_on_ = true;
    std::fprintf(stderr,
                 "[cuda] programmatic dependent launch on: the decode chain's kernels overlap their "
                 "predecessor's tail (CudaBackendStats().pdl_launches counts them)\n");
  } else {
    std::fprintf(stderr, "[cuda] programmatic dependent launch asked for, but %s is sm_%d%d (needs sm_90+): off\n",
                 prop_.name, prop_.major, prop_.minor);
  }
}

void BackendDevice::ReleasePdl(cudaStream_t stream, const std::atomic<int64_t>& launches) {
  if (!pdl_on_) return;
  DisablePdlOnStream(stream);
  pdl_on_ = false;
  std::fprintf(stderr, "[cuda] %lld kernel launches (eager or captured) used programmatic dependent launch\n",
               static_cast<long long>(launches.load()));
}

std::string BackendDevice::MemoryDescription() const {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return "device memory: unknown (cudaMemGetInfo failed)";
  }
  char line[160];
  std::snprintf(line, sizeof(line), "device memory: %.2f GiB used of %.2f GiB (%s)", (total - free) / 1073741824.0,
                total / 1073741824.0, name_.c_str());
  return line;
}

}  // namespace dsmesh

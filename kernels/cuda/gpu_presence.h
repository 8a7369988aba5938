// Is there a CUDA GPU to run on? ProbeCudaGpus answers without selecting a device or creating a context
// (the default device of every command is chosen from it, kernels/cuda/device_choice.h); RequireCudaDevice
// is the first check of every CUDA entry point (dsmesh-kernel-bench, a worker with --device cuda). Their
// messages say what a newcomer should look at, instead of the CUDA runtime's error name (which reads
// "cudaErrorInsufficientDriver" on a machine with no GPU at all).
#pragma once

#include <cstdint>
#include <string>

namespace dsmesh {

// What the CUDA runtime sees. Device 0's name and memory are filled when count > 0; otherwise
// `none_reason` says why no GPU is visible ("no NVIDIA driver is loaded on this machine", a driver older
// than this build's CUDA runtime, CUDA_VISIBLE_DEVICES hiding them) and `cuda_error` is the runtime's own
// error ("cudaErrorNoDevice: no CUDA-capable device is detected"), empty when it reported none.
struct CudaGpus {
  int count = 0;
  std::string first_name;
  int64_t first_total_bytes = 0;
  std::string none_reason;
  std::string cuda_error;
};
CudaGpus ProbeCudaGpus();

// Throws std::runtime_error("WHO needs CUDA device INDEX, but no CUDA GPU is visible ...; check
// `nvidia-smi` ...") unless CUDA device `index` exists; other failures (a driver older than this build's
// CUDA runtime, an index past the visible devices) are named the same way, with `nvidia-smi` as the next
// thing to check. `who` is what needs the GPU ("the benchmark", "worker rank 2"). Does not select the
// device.
void RequireCudaDevice(int index, const std::string& who);

}  // namespace dsmesh

// The first check of every CUDA entry point (dsmesh-kernel-bench, a worker with --device cuda): is
// there a GPU to run on? Its message says what a newcomer should look at, instead of the CUDA
// runtime's error name (which reads "cudaErrorInsufficientDriver" on a machine with no GPU at all).
#pragma once

#include <string>

namespace dsmesh {

// Throws std::runtime_error("WHO needs CUDA device INDEX, but no CUDA GPU is visible ...; check
// `nvidia-smi` ...") unless CUDA device `index` exists; other failures (a driver older than this build's
// CUDA runtime, an index past the visible devices) are named the same way, with `nvidia-smi` as the next
// thing to check. `who` is what needs the GPU ("the benchmark", "worker rank 2"). Does not select the
// device.
void RequireCudaDevice(int index, const std::string& who);

}  // namespace dsmesh

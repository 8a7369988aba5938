// Which device a command runs on: the one --device names, else a CUDA GPU when the CUDA runtime sees one,
// else the CPU. Every command with a device (up, generate, logits, ppl, bench) decides it here and prints
// Line(), so a user reads which device was chosen and why.
#pragma once

#include <string>

#include "common/flags.h"
#include "kernels/cuda/gpu_presence.h"

namespace dsmesh {

struct DeviceChoice {
  std::string device;  // "cpu", "cuda", or "cuda:N" (as --device spells it; the default is "cuda:0")
  std::string reason;  // why this device, and how to pick the other
  bool given = false;  // named by --device

  bool cuda() const { return device.rfind("cuda", 0) == 0; }
  // "device: cuda:0 (NVIDIA H200, 139.8 GiB; found by the CUDA runtime; --device cpu to run on the CPU)"
  std::string Line() const { return "device: " + device + " (" + reason + ")"; }
};

// The device when --device is not given, from what the CUDA runtime sees: CUDA device 0 when there is
// one (its name and memory in the reason), else the CPU with the reason none is visible.
DeviceChoice DefaultDevice(const CudaGpus& gpus);

// --device as given (the CUDA runtime is not asked), else DefaultDevice(ProbeCudaGpus()).
DeviceChoice ChooseDevice(const Flags& f);

}  // namespace dsmesh

#include "kernels/cuda/device_choice.h"

#include <cstdio>

namespace dsmesh {

DeviceChoice DefaultDevice(const CudaGpus& gpus) {
  DeviceChoice c;
  if (gpus.count > 0) {
    char memory[64] = "";
    if (gpus.first_total_bytes > 0)
      std::snprintf(memory, sizeof(memory), ", %.1f GiB", static_cast<double>(gpus.first_total_bytes) / (1 << 30));
    c.device = "cuda:0";
    c.reason = (gpus.first_name.empty() ? std::string("a CUDA GPU") : gpus.first_name) + memory +
               "; found by the CUDA runtime" +
               (gpus.count > 1 ? ", the first of " + std::to_string(gpus.count) + " visible (--device cuda:N for another)"
                               : std::string()) +
               "; --device cpu to run on the CPU";
    return c;
  }
  c.device = "cpu";
  c.reason = (gpus.none_reason.empty() ? std::string("no CUDA GPU is visible") : gpus.none_reason) +
             "; --device cuda to require a GPU";
  return c;
}

DeviceChoice ChooseDevice(const Flags& f) {
  if (f.Has("device")) {
    DeviceChoice c;
    c.device = f.Get("device");
    c.reason = "given by --device";
    c.given = true;
    return c;
  }
  return DefaultDevice(ProbeCudaGpus());
}

}  // namespace dsmesh

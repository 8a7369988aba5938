// Turns a CUDA runtime status into a std::runtime_error that says what was being done.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace dsmesh {

inline void CudaCheck(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error(what + ": CUDA error " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// Runs a setup step once per process and device (kernel attributes, occupancy queries: things that
// must happen before any launch or graph capture on that device), for the current device:
//   static PerDeviceOnce once;
//   once.Run([](int device) { ... });
class PerDeviceOnce {
 public:
  template <class Fn>
  void Run(Fn&& fn) {
    int dev = 0;
    CudaCheck(cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= kMaxDevices) throw std::runtime_error("device " + std::to_string(dev) + " out of range");
    std::lock_guard<std::mutex> lock(mu_);
    if (done_[dev]) return;
    fn(dev);
    done_[dev] = true;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::mutex mu_;
  bool done_[kMaxDevices] = {};
};

}  // namespace dsmesh

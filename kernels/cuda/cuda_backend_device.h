// The CUDA backend's device as the backend names and sets it up: its name ("cuda:0 (NVIDIA H200)"), the
// line of Backend::MemoryDescription, and programmatic dependent launch on the backend's stream
// (pdl_streams.h): registered where the device has it, logged when it is turned on and when it is
// released. Every call expects the backend's device current (StreamContext::Use).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace dsmesh {

class BackendDevice {
 public:
  // Reads the device's properties.
  explicit BackendDevice(int device);
  BackendDevice(const BackendDevice&) = delete;
  BackendDevice& operator=(const BackendDevice&) = delete;

  const std::string& name() const { return name_; }

  // Turns PDL on for `stream` (launches with the attribute counted in *launches) when the device has it
  // (sm_90+), else logs that it stays off.
  void EnablePdl(cudaStream_t stream, std::atomic<int64_t>* launches);
  // Unregisters `stream` when PDL is on (the stream may outlive the backend: tensors' deleters) and logs
  // how many launches used it.
  void ReleasePdl(cudaStream_t stream, const std::atomic<int64_t>& launches);

  // "device memory: X GiB used of Y GiB (name)", or why it is unknown.
  std::string MemoryDescription() const;

 private:
  cudaDeviceProp prop_{};
  std::string name_;
  bool pdl_on_ = false;  // PDL asked for on a device that has it: the stream is registered
};

}  // namespace dsmesh

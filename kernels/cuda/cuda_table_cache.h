// Device copies of host tables that live as long as the model (rope frequencies, hash routing's tid2eid),
// uploaded once and keyed by host address. Each entry keeps what makes the key safe: a copy of a small
// table's values (compared on every hit) or a reference to a tensor's host buffer (so its address cannot
// be reused). Ops of the CUDA backend read them from the device without a per-step copy.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "common/tensor.h"

namespace dsmesh {

class DeviceTableCache {
 public:
  DeviceTableCache() = default;
  ~DeviceTableCache();
  DeviceTableCache(const DeviceTableCache&) = delete;
  DeviceTableCache& operator=(const DeviceTableCache&) = delete;

  // A rope table's device copy (re-uploaded when the values at that address changed).
  const float* Floats(const std::vector<float>& v);
  // tid2eid arrives as a host tensor (the loader keeps routing tables on the host) or already on device.
  const int32_t* Ints(const Tensor& t);

 private:
  struct CachedCopy {
    void* device = nullptr;
    std::vector<char> values;
    std::shared_ptr<void> keep_alive;
  };
  std::mutex mu_;
  std::map<std::pair<const void*, size_t>, CachedCopy> host_cache_;
  std::set<const void*> device_tables_;  // routing tables already in device memory
};

}  // namespace dsmesh

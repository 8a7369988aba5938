#include "kernels/cuda/cuda_table_cache.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_backend_util.h"
#include "kernels/cuda/cuda_check.h"

namespace dsmesh {

DeviceTableCache::~DeviceTableCache() {
  for (auto& [k, c] : host_cache_) cudaFree(c.device);
}

const float* DeviceTableCache::Floats(const std::vector<float>& v) {
  const size_t bytes = v.size() * sizeof(float);
  std::lock_guard<std::mutex> lock(mu_);
  CachedCopy& c = host_cache_[{v.data(), bytes}];
  if (c.device && std::memcmp(c.values.data(), v.data(), bytes) == 0) return static_cast<const float*>(c.device);
  if (!c.device) CudaCheck(cudaMalloc(&c.device, std::max<size_t>(bytes, 16)), "cudaMalloc for a rope table");
  c.values.assign(reinterpret_cast<const char*>(v.data()), reinterpret_cast<const char*>(v.data()) + bytes);
  CudaCheck(cudaMemcpy(c.device, v.data(), bytes, cudaMemcpyHostToDevice), "rope table upload");
  return static_cast<const float*>(c.device);
}
const int32_t* DeviceTableCache::Ints(const Tensor& t) {
  std::lock_guard<std::mutex> lock(mu_);
  auto known = host_cache_.find({t.data, t.nbytes()});
  if (known != host_cache_.end() && known->second.device) return static_cast<const int32_t*>(known->second.device);
  if (device_tables_.count(t.data)) return I32(t);
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, t.data) == cudaSuccess && a.type == cudaMemoryTypeDevice) {
    device_tables_.insert(t.data);
    return I32(t);
  }
  cudaGetLastError();
  CachedCopy& c = host_cache_[{t.data, t.nbytes()}];
  if (!c.device) {
    CudaCheck(cudaMalloc(&c.device, std::max<size_t>(t.nbytes(), 16)), "cudaMalloc for a routing table");
    CudaCheck(cudaMemcpy(c.device, t.data, t.nbytes(), cudaMemcpyHostToDevice), "routing table upload");
    c.keep_alive = t.owner;
  }
  return static_cast<const int32_t*>(c.device);
}

}  // namespace dsmesh

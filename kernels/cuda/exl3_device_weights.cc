#include "kernels/cuda/exl3_device_weights.h"

#include <cuda_runtime.h>

#include <stdexcept>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/synthetic_exl3_kernels.h"

namespace dsmesh {
namespace {

void* UploadTensor(const Tensor& t, const std::string& what) {
  void* d = nullptr;
  CudaCheck(cudaMalloc(&d, std::max<size_t>(t.nbytes(), 16)), "cudaMalloc for " + what);
  CudaCheck(cudaMemcpy(d, t.data, t.nbytes(), cudaMemcpyHostToDevice), "upload of " + what);
  return d;
}

}  // namespace

Exl3DeviceLinearBuffers::Exl3DeviceLinearBuffers(const Exl3Weight& w) {
  trellis_ = UploadTensor(w.trellis, w.name + ".trellis");
  suh_ = UploadTensor(w.suh, w.name + ".suh");
  svh_ = UploadTensor(w.svh, w.name + ".svh");
  linear_.k = w.k_padded();
  linear_.n = w.n_padded();
  linear_.K = w.K;
  linear_.codebook = static_cast<int>(w.codebook);
  linear_.trellis = static_cast<const uint16_t*>(trellis_);
  linear_.suh = static_cast<const uint16_t*>(suh_);
  linear_.svh = static_cast<const uint16_t*>(svh_);
  linear_.name = w.name;
}

Exl3DeviceLinearBuffers::Exl3DeviceLinearBuffers(const std::string& name, int64_t k0, int64_t k1, int64_t n0, int64_t n1,
                                                 int64_t full_k, int64_t full_n, int K, uint64_t seed) {
  const int64_t k = k1 - k0, n = n1 - n0;
  if (k <= 0 || n <= 0 || k0 % 128 || k1 % 128 || n0 % 128 || n1 % 128 || k1 > full_k || n1 > full_n)
    throw std::runtime_error(name + ": synthetic block [" + std::to_string(k0) + ", " + std::to_string(k1) + ") x [" +
                             std::to_string(n0) + ", " + std::to_string(n1) + ") is not a 128-aligned block of " +
                             std::to_string(full_k) + " x " + std::to_string(full_n));
  const size_t trellis_bytes = static_cast<size_t>(k / 16) * (n / 16) * 16 * K * 2;
  CudaCheck(cudaMalloc(&trellis_, trellis_bytes), "cudaMalloc for " + name + ".trellis (" +
                                                      std::to_string(trellis_bytes >> 20) + " MiB)");
  CudaCheck(cudaMalloc(&suh_, k * 2), "cudaMalloc for " + name + ".suh");
  CudaCheck(cudaMalloc(&svh_, n * 2), "cudaMalloc for " + name + ".svh");
  FillSyntheticExl3Block(static_cast<uint16_t*>(trellis_), static_cast<uint16_t*>(suh_), static_cast<uint16_t*>(svh_),
                         k0, k1, n0, n1, full_k, full_n, K, seed, nullptr);
  // The generator runs on the legacy default stream; the backends' streams do not wait for it.
  CudaCheck(cudaStreamSynchronize(nullptr), "synthetic weights for " + name);
  linear_.k = k;
  linear_.n = n;
  linear_.K = K;
  linear_.codebook = static_cast<int>(Exl3Codebook::kMcg);
  linear_.trellis = static_cast<const uint16_t*>(trellis_);
  linear_.suh = static_cast<const uint16_t*>(suh_);
  linear_.svh = static_cast<const uint16_t*>(svh_);
  linear_.name = name;
}

Exl3DeviceLinearBuffers::~Exl3DeviceLinearBuffers() {
  cudaFree(trellis_);
  cudaFree(suh_);
  cudaFree(svh_);
}

Exl3DeviceMoeLayer::Exl3DeviceMoeLayer(const std::string& name, const std::vector<Expert>& experts,
                                       float swiglu_limit) {
  if (experts.empty()) throw std::runtime_error(name + ": no experts");
  for (const Expert& e : experts)
    for (const Exl3Weight* w : {e.gate, e.up, e.down}) {
      if (w->codebook != Exl3Codebook::kMcg)
        throw std::runtime_error(w->name + ": codebook " + Exl3CodebookName(w->codebook) +
                                 " (the routed-expert kernel is built for mcg)");
      if (w->bias) throw std::runtime_error(w->name + ": has a bias (not supported by the routed-expert kernel)");
    }
  std::vector<DeviceExpert> views;
  for (const Expert& e : experts) {
    const Exl3DeviceLinear* l[3];
    int p = 0;
    for (const Exl3Weight* w : {e.gate, e.up, e.down}) {
      linears_.push_back(std::make_unique<Exl3DeviceLinearBuffers>(*w));
      l[p++] = &linears_.back()->linear();
    }
    views.push_back({l[0], l[1], l[2]});
  }
  Build(name, views, swiglu_limit);
}

Exl3DeviceMoeLayer::Exl3DeviceMoeLayer(const std::string& name, const std::vector<DeviceExpert>& experts,
                                       float swiglu_limit) {
  Build(name, experts, swiglu_limit);
}

void Exl3DeviceMoeLayer::Build(const std::string& name, const std::vector<DeviceExpert>& experts, float swiglu_limit) {
  if (experts.empty()) throw std::runtime_error(name + ": no experts");
  const Exl3DeviceLinear& g0 = *experts[0].gate;
  const int64_t hidden = g0.k, inter = g0.n;
  const int K = g0.K;
  std::vector<const uint16_t*> tabs[9];
  for (const DeviceExpert& e : experts) {
    const Exl3DeviceLinear* ws[3] = {e.gate, e.up, e.down};
    for (int p = 0; p < 3; ++p) {
      const Exl3DeviceLinear& w = *ws[p];
      const int64_t k = p == 2 ? inter : hidden, n = p == 2 ? hidden : inter;
      if (w.k != k || w.n != n)
        throw std::runtime_error(w.name + ": shape " + std::to_string(w.k) + "x" + std::to_string(w.n) + ", expected " +
                                 std::to_string(k) + "x" + std::to_string(n) + " like expert 0");
      if (w.K != K)
        throw std::runtime_error(w.name + ": K = " + std::to_string(w.K) + " but expert 0 gate has K = " +
                                 std::to_string(K) + " (the routed-expert kernel needs one K per layer)");
      if (w.codebook != static_cast<int>(Exl3Codebook::kMcg))
        throw std::runtime_error(w.name + ": codebook is not mcg (the routed-expert kernel is built for mcg)");
      tabs[p * 3 + 0].push_back(w.trellis);
      tabs[p * 3 + 1].push_back(w.suh);
      tabs[p * 3 + 2].push_back(w.svh);
    }
  }
  for (int t = 0; t < 9; ++t) {
    void* d = nullptr;
    CudaCheck(cudaMalloc(&d, tabs[t].size() * sizeof(void*)), name + ": pointer table");
    CudaCheck(cudaMemcpy(d, tabs[t].data(), tabs[t].size() * sizeof(void*), cudaMemcpyHostToDevice),
              name + ": pointer table");
    tables_[t] = static_cast<const uint16_t**>(d);
  }
  layer_.name = name;
  layer_.num_experts = static_cast<int>(experts.size());
  layer_.hidden = static_cast<int>(hidden);
  layer_.inter = static_cast<int>(inter);
  layer_.K = K;
  layer_.codebook = 1;
  layer_.swiglu_limit = swiglu_limit;
  layer_.SetTables(tables_);
}

Exl3DeviceMoeLayer::~Exl3DeviceMoeLayer() {
  for (auto* t : tables_) cudaFree(const_cast<uint16_t**>(t));
}

}  // namespace dsmesh

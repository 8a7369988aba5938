#include "kernels/cuda/exl3_device_weights.h"

#include <cuda_runtime.h>

#include <stdexcept>

#include "kernels/cuda/cuda_check.h"

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

Exl3DeviceLinearBuffers::~Exl3DeviceLinearBuffers() {
  cudaFree(trellis_);
  cudaFree(suh_);
  cudaFree(svh_);
}

Exl3DeviceMoeLayer::Exl3DeviceMoeLayer(const std::string& name, const std::vector<Expert>& experts,
                                       float swiglu_limit) {
  if (experts.empty()) throw std::runtime_error(name + ": no experts");
  const Exl3Weight& g0 = *experts[0].gate;
  const int64_t hidden = g0.k_padded(), inter = g0.n_padded();
  const int K = g0.K;
  std::vector<const uint16_t*> tabs[9];
  for (size_t e = 0; e < experts.size(); ++e) {
    const Exl3Weight* ws[3] = {experts[e].gate, experts[e].up, experts[e].down};
    for (int p = 0; p < 3; ++p) {
      const Exl3Weight& w = *ws[p];
      const int64_t k = p == 2 ? inter : hidden, n = p == 2 ? hidden : inter;
      if (w.k_padded() != k || w.n_padded() != n)
        throw std::runtime_error(w.name + ": shape " + std::to_string(w.k_padded()) + "x" + std::to_string(w.n_padded()) +
                                 ", expected " + std::to_string(k) + "x" + std::to_string(n) + " like expert 0");
      if (w.K != K)
        throw std::runtime_error(w.name + ": K = " + std::to_string(w.K) + " but expert 0 gate has K = " +
                                 std::to_string(K) + " (the routed-expert kernel needs one K per layer)");
      if (w.codebook != Exl3Codebook::kMcg)
        throw std::runtime_error(w.name + ": codebook " + Exl3CodebookName(w.codebook) +
                                 " (the routed-expert kernel is built for mcg)");
      if (w.bias) throw std::runtime_error(w.name + ": has a bias (not supported by the routed-expert kernel)");
      linears_.push_back(std::make_unique<Exl3DeviceLinearBuffers>(w));
      const Exl3DeviceLinear& l = linears_.back()->linear();
      tabs[p * 3 + 0].push_back(l.trellis);
      tabs[p * 3 + 1].push_back(l.suh);
      tabs[p * 3 + 2].push_back(l.svh);
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

// Device copies of EXL3 weights for the CUDA kernels: one linear (Exl3DeviceLinear) or a whole MoE
// layer's routed experts with their pointer tables (Exl3MoeLayer). Built once at load time from the
// validated CPU-side Exl3Weight (kernels/exl3/exl3_linear.h); the objects own the device memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/exl3_gemv.h"
#include "kernels/cuda/exl3_moe.h"
#include "kernels/exl3/exl3_linear.h"

namespace dsmesh {

// One linear's trellis, suh and svh in device memory (current device).
class Exl3DeviceLinearBuffers {
 public:
  explicit Exl3DeviceLinearBuffers(const Exl3Weight& w);
  // The [k0, k1) x [n0, n1) block (multiples of 128) of a synthetic full_k x full_n MCG linear of K bits,
  // generated on the device (kernels/exl3/synthetic_exl3.h has the host twin).
  Exl3DeviceLinearBuffers(const std::string& name, int64_t k0, int64_t k1, int64_t n0, int64_t n1, int64_t full_k,
                          int64_t full_n, int K, uint64_t seed);
  ~Exl3DeviceLinearBuffers();
  Exl3DeviceLinearBuffers(const Exl3DeviceLinearBuffers&) = delete;
  Exl3DeviceLinearBuffers& operator=(const Exl3DeviceLinearBuffers&) = delete;

  const Exl3DeviceLinear& linear() const { return linear_; }

 private:
  void* trellis_ = nullptr;
  void* suh_ = nullptr;
  void* svh_ = nullptr;
  Exl3DeviceLinear linear_;
};

// A MoE layer's routed experts: experts[e] = {gate, up, down} (gate/up: hidden -> inter, down:
// inter -> hidden). Checks what the routed-expert kernel needs and throws naming the expert tensor
// otherwise: same K for every projection, MCG codebook, no biases, consistent shapes.
class Exl3DeviceMoeLayer {
 public:
  struct Expert {
    const Exl3Weight* gate;
    const Exl3Weight* up;
    const Exl3Weight* down;
  };
  Exl3DeviceMoeLayer(const std::string& name, const std::vector<Expert>& experts, float swiglu_limit);
  // Over linears already in device memory, owned by the caller and outliving the layer: experts[e] =
  // {gate, up, down}.
  struct DeviceExpert {
    const Exl3DeviceLinear* gate;
    const Exl3DeviceLinear* up;
    const Exl3DeviceLinear* down;
  };
  Exl3DeviceMoeLayer(const std::string& name, const std::vector<DeviceExpert>& experts, float swiglu_limit);
  ~Exl3DeviceMoeLayer();
  Exl3DeviceMoeLayer(const Exl3DeviceMoeLayer&) = delete;
  Exl3DeviceMoeLayer& operator=(const Exl3DeviceMoeLayer&) = delete;

  const Exl3MoeLayer& layer() const { return layer_; }

 private:
  void Build(const std::string& name, const std::vector<DeviceExpert>& experts, float swiglu_limit);

  std::vector<std::unique_ptr<Exl3DeviceLinearBuffers>> linears_;
  const uint16_t** tables_[9] = {};
  Exl3MoeLayer layer_;
};

}  // namespace dsmesh

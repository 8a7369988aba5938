// Helpers for the GPU tests: skip without a GPU, device buffers, random EXL3 weights and the fp64
// reference of an EXL3 linear built on the CPU decoder of kernels/exl3 (bit-exact Ŵ).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/exl3_gemv.h"
#include "kernels/exl3/exl3_linear.h"

namespace dsmesh::testing {

inline bool HasGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Whether a missing GPU fails the test instead of skipping it (DSMESH_REQUIRE_GPU_TESTS=1, set by the
// GPU machine's scripts, so that a skip there never reads as a pass).
inline bool GpuTestsRequired() {
  const char* v = std::getenv("DSMESH_REQUIRE_GPU_TESTS");
  return v && std::string(v) == "1";
}

// Skips without a GPU, printing "GPU TEST SKIPPED" (./dsmesh test counts these lines), or fails when
// GPU tests are required.
#define DSMESH_REQUIRE_GPU()                                                                          \
  do {                                                                                                \
    if (!::dsmesh::testing::HasGpu()) {                                                               \
      if (::dsmesh::testing::GpuTestsRequired()) FAIL() << "no CUDA GPU visible but DSMESH_REQUIRE_GPU_TESTS=1"; \
      std::printf("GPU TEST SKIPPED: %s (no CUDA GPU visible)\n",                                     \
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());                   \
      GTEST_SKIP() << "no CUDA GPU here: GPU code is compiled but only runs on a GPU machine";        \
    }                                                                                                 \
  } while (0)

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    CudaCheck(cudaMalloc(&ptr_, std::max<size_t>(count, 1) * sizeof(T)), "test cudaMalloc");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), count_(o.count_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  void Upload(const std::vector<T>& host) {
    CudaCheck(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "test upload");
  }
  std::vector<T> Download() const {
    std::vector<T> h(count_);
    CudaCheck(cudaMemcpy(h.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost), "test download");
    return h;
  }
  void PoisonNaN() { CudaCheck(cudaMemset(ptr_, 0xFF, count_ * sizeof(T)), "test poison"); }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// A random EXL3 linear (random int16 trellis is a valid code; suh/svh ~ +-N(1, 0.3)).
inline Exl3Weight RandomExl3Weight(int64_t k, int64_t n, int K, Exl3Codebook cb, std::mt19937& rng) {
  Exl3Weight w;
  w.in_features = k;
  w.out_features = n;
  w.K = K;
  w.codebook = cb;
  w.name = "random.K" + std::to_string(K);
  w.trellis = AllocateTensor(DType::kI16, {k / 16, n / 16, 16 * K});
  w.suh = AllocateTensor(DType::kF16, {k});
  w.svh = AllocateTensor(DType::kF16, {n});
  auto* t = w.trellis.as<uint16_t>();
  std::uniform_int_distribution<int> bits(0, 65535);
  for (int64_t i = 0; i < w.trellis.numel(); ++i) t[i] = static_cast<uint16_t>(bits(rng));
  std::normal_distribution<float> mag(1.0f, 0.3f);
  std::bernoulli_distribution sign(0.5);
  for (int64_t i = 0; i < k; ++i) w.suh.as<uint16_t>()[i] = FloatToFp16((sign(rng) ? -1.f : 1.f) * std::fabs(mag(rng)));
  for (int64_t i = 0; i < n; ++i) w.svh.as<uint16_t>()[i] = FloatToFp16((sign(rng) ? -1.f : 1.f) * std::fabs(mag(rng)));
  return w;
}

// Device copies of one linear's tensors.
struct DeviceExl3 {
  DeviceBuffer<uint16_t> trellis, suh, svh;
  Exl3DeviceLinear linear;
};

inline void UploadExl3(const Exl3Weight& w, DeviceExl3& d) {
  const auto* t = w.trellis.as<uint16_t>();
  d.trellis = DeviceBuffer<uint16_t>(std::vector<uint16_t>(t, t + w.trellis.numel()));
  const auto* s = w.suh.as<uint16_t>();
  d.suh = DeviceBuffer<uint16_t>(std::vector<uint16_t>(s, s + w.suh.numel()));
  const auto* v = w.svh.as<uint16_t>();
  d.svh = DeviceBuffer<uint16_t>(std::vector<uint16_t>(v, v + w.svh.numel()));
  d.linear.k = w.k_padded();
  d.linear.n = w.n_padded();
  d.linear.K = w.K;
  d.linear.codebook = static_cast<int>(w.codebook);
  d.linear.trellis = d.trellis.get();
  d.linear.suh = d.suh.get();
  d.linear.svh = d.svh.get();
  d.linear.name = w.name;
}

// fp64 block Hadamard (orthonormal H128 / sqrt(128)) over every 128-block of a row, in place.
inline void Hadamard128F64(double* v, int64_t len) {
  for (int64_t b = 0; b < len; b += 128) {
    double* p = v + b;
    for (int h = 1; h < 128; h <<= 1)
      for (int i = 0; i < 128; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const double a = p[j], c = p[j + h];
          p[j] = a + c;
          p[j + h] = a - c;
        }
    for (int i = 0; i < 128; ++i) p[i] /= std::sqrt(128.0);
  }
}

// Exact y = ((x * suh) Hk) Ŵ Hn * svh in fp64 for one row; what = Ŵ (fp16 bits, k x n), x in fp64.
inline std::vector<double> Exl3RowF64(const std::vector<uint16_t>& what, const uint16_t* suh, const uint16_t* svh,
                                      const double* x, int64_t k, int64_t n) {
  std::vector<double> xs(k), y(n, 0.0);
  for (int64_t i = 0; i < k; ++i) xs[i] = x[i] * Fp16ToFloat(suh[i]);
  Hadamard128F64(xs.data(), k);
  for (int64_t i = 0; i < k; ++i) {
    const double a = xs[i];
    const uint16_t* wr = what.data() + i * n;
    for (int64_t j = 0; j < n; ++j) y[j] += a * Fp16ToFloat(wr[j]);
  }
  Hadamard128F64(y.data(), n);
  for (int64_t j = 0; j < n; ++j) y[j] *= Fp16ToFloat(svh[j]);
  return y;
}

inline double RelL2(const float* got, const double* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline bool AllFinite(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isfinite(f)) return false;
  return true;
}

// Random fp16 activations ~ N(0, 1).
inline std::vector<uint16_t> RandomFp16(size_t count, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<uint16_t> v(count);
  for (auto& x : v) x = FloatToFp16(nd(rng));
  return v;
}

}  // namespace dsmesh::testing

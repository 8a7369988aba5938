#include "kernels/kv_rows.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/half.h"

namespace dsmesh {
namespace {

constexpr float kE4M3Max = 448.0f;

void CheckStorage(DType storage, int64_t dim, int64_t rope_dim) {
  if (storage != DType::kF32 && storage != DType::kBF16 && storage != DType::kU8)
    throw std::invalid_argument(std::string("KV rows: storage ") + DTypeName(storage) + " is not F32, BF16 or U8 (fp8)");
  if (rope_dim < 0 || rope_dim > dim) throw std::invalid_argument("KV rows: rope_dim outside [0, dim]");
}

}  // namespace

int64_t KvRowBytes(DType storage, int64_t dim, int64_t rope_dim) {
  CheckStorage(storage, dim, rope_dim);
  switch (storage) {
    case DType::kF32: return 4 * dim;
    case DType::kBF16: return 2 * dim;
    default: return dim - rope_dim + 4 + 2 * rope_dim;
  }
}

void EncodeKvRows(const float* src, int64_t rows, int64_t dim, int64_t rope_dim, DType storage, void* dst) {
  const int64_t bytes = KvRowBytes(storage, dim, rope_dim);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * dim;
    uint8_t* out = static_cast<uint8_t*>(dst) + r * bytes;
    if (storage == DType::kF32) {
      std::memcpy(out, x, static_cast<size_t>(bytes));
      continue;
    }
    if (storage == DType::kBF16) {
      for (int64_t i = 0; i < dim; ++i) {
        const uint16_t b = FloatToBf16(x[i]);
        std::memcpy(out + 2 * i, &b, 2);
      }
      continue;
    }
    const int64_t nope = dim - rope_dim;
    float amax = 0.0f;
    for (int64_t i = 0; i < nope; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float scale = amax > 0.0f ? amax / kE4M3Max : 1.0f;
    for (int64_t i = 0; i < nope; ++i) out[i] = FloatToFp8E4M3(x[i] / scale);
    std::memcpy(out + nope, &scale, 4);
    for (int64_t i = 0; i < rope_dim; ++i) {
      const uint16_t b = FloatToBf16(x[nope + i]);
      std::memcpy(out + nope + 4 + 2 * i, &b, 2);
    }
  }
}

void DecodeKvRows(const void* src, int64_t rows, int64_t dim, int64_t rope_dim, DType storage, float* dst) {
  const int64_t bytes = KvRowBytes(storage, dim, rope_dim);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = static_cast<const uint8_t*>(src) + r * bytes;
    float* y = dst + r * dim;
    if (storage == DType::kF32) {
      std::memcpy(y, in, static_cast<size_t>(bytes));
      continue;
    }
    if (storage == DType::kBF16) {
      for (int64_t i = 0; i < dim; ++i) {
        uint16_t b;
        std::memcpy(&b, in + 2 * i, 2);
        y[i] = Bf16ToFloat(b);
      }
      continue;
    }
    const int64_t nope = dim - rope_dim;
    float scale;
    std::memcpy(&scale, in + nope, 4);
    for (int64_t i = 0; i < nope; ++i) y[i] = Fp8E4M3ToFloat(in[i]) * scale;
    for (int64_t i = 0; i < rope_dim; ++i) {
      uint16_t b;
      std::memcpy(&b, in + nope + 4 + 2 * i, 2);
      y[nope + i] = Bf16ToFloat(b);
    }
  }
}

}  // namespace dsmesh

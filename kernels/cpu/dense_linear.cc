#include "kernels/cpu/dense_linear.h"

#include <stdexcept>
#include <string>

#include "common/half.h"
#include "kernels/cpu/vec.h"

namespace dsmesh {
namespace cpu {
namespace {

template <DType T>
inline __m256 Load8(const void* w, int64_t i) {
  if constexpr (T == DType::kBF16) return LoadBf16x8(static_cast<const uint16_t*>(w) + i);
  if constexpr (T == DType::kF16) return LoadF16x8(static_cast<const uint16_t*>(w) + i);
  if constexpr (T == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(w) + i);
}

template <DType T>
inline float Scalar(const void* w, int64_t i) {
  if constexpr (T == DType::kBF16) return Bf16Scalar(static_cast<const uint16_t*>(w)[i]);
  if constexpr (T == DType::kF16) return Fp16ToFloat(static_cast<const uint16_t*>(w)[i]);
  if constexpr (T == DType::kF32) return static_cast<const float*>(w)[i];
}

template <DType T>
const void* Row(const void* w, int64_t r, int64_t ldw) {
  constexpr size_t kElement = T == DType::kF32 ? 4 : 2;
  return static_cast<const char*>(w) + static_cast<size_t>(r) * ldw * kElement;
}

// R activation rows (1..4) against one weight row.
template <DType T, int R>
inline void DotRows(const float* const* xs, const void* wr, int64_t in, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    __m256 wv = Load8<T>(wr, i);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xs[r] + i), acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = HorizontalSum(acc[r]);
    for (int64_t k = i; k < in; ++k) s += Scalar<T>(wr, k) * xs[r][k];
    out[r] = s;
  }
}

template <DType T>
void Run(const float* x, int64_t ldx, int64_t m, const void* w, int64_t ldw, int64_t out, int64_t in, float* y,
         int64_t ldy) {
  // Blocks of output rows per task; every task walks all activation rows in groups of 4 so a weight row
  // is loaded from memory once per 4 activation rows. Dynamic scheduling: on a shared machine one thread
  // may be descheduled, and the others should take over its blocks rather than wait at the barrier.
  constexpr int64_t kBlock = 32;
  const int64_t blocks = (out + kBlock - 1) / kBlock;
  cpu::ParallelFor(blocks, out * in * m, [&](int64_t b) {
    const int64_t j0 = b * kBlock, j1 = std::min(out, j0 + kBlock);
    for (int64_t r0 = 0; r0 < m; r0 += 4) {
      const int R = static_cast<int>(std::min<int64_t>(4, m - r0));
      const float* xs[4];
      for (int r = 0; r < R; ++r) xs[r] = x + (r0 + r) * ldx;
      for (int64_t j = j0; j < j1; ++j) {
        float res[4];
        const void* wr = Row<T>(w, j, ldw);
        switch (R) {
          case 4: DotRows<T, 4>(xs, wr, in, res); break;
          case 3: DotRows<T, 3>(xs, wr, in, res); break;
          case 2: DotRows<T, 2>(xs, wr, in, res); break;
          default: DotRows<T, 1>(xs, wr, in, res); break;
        }
        for (int r = 0; r < R; ++r) y[(r0 + r) * ldy + j] = res[r];
      }
    }
  });
}

}  // namespace

void DenseLinear(const float* x, int64_t ldx, int64_t m, const void* w, DType wtype, int64_t ldw, int64_t out,
                 int64_t in, float* y, int64_t ldy) {
  switch (wtype) {
    case DType::kBF16: return Run<DType::kBF16>(x, ldx, m, w, ldw, out, in, y, ldy);
    case DType::kF16: return Run<DType::kF16>(x, ldx, m, w, ldw, out, in, y, ldy);
    case DType::kF32: return Run<DType::kF32>(x, ldx, m, w, ldw, out, in, y, ldy);
    default: throw std::runtime_error(std::string("DenseLinear: unsupported weight dtype ") + DTypeName(wtype));
  }
}

void DenseLinearReference(const float* x, int64_t ldx, int64_t m, const void* w, DType wtype, int64_t ldw,
                          int64_t out, int64_t in, float* y, int64_t ldy) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < out; ++j) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k) {
        float wv;
        switch (wtype) {
          case DType::kBF16: wv = Bf16ToFloat(static_cast<const uint16_t*>(w)[j * ldw + k]); break;
          case DType::kF16: wv = Fp16ToFloat(static_cast<const uint16_t*>(w)[j * ldw + k]); break;
          case DType::kF32: wv = static_cast<const float*>(w)[j * ldw + k]; break;
          default: throw std::runtime_error("DenseLinearReference: unsupported dtype");
        }
        s += static_cast<double>(wv) * x[r * ldx + k];
      }
      y[r * ldy + j] = static_cast<float>(s);
    }
}

}  // namespace cpu
}  // namespace dsmesh

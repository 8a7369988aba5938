#include "kernels/cpu/dense_linear.h"

#include <stdexcept>
#include <string>

#include "common/half.h"
#include "kernels/cpu/thread_pool.h"
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

// Sums of each of 8 vectors, as one vector: lane a = sum of acc[a]. Every lane reduces in the same order
// ((0+1)+(2+3)) + ((4+5)+(6+7)), so a dot product does not depend on which tile shape computed it.
inline __m256 Reduce8(const __m256* acc) {
  __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// A tile of R activation rows x J weight rows (R*J <= 8): 8 independent FMA chains, one reduction.
template <DType T, int R, int J>
inline void Tile(const float* const* xs, const void* w, int64_t ldw, int64_t j0, int64_t in, float* y, int64_t ldy) {
  static_assert(R * J <= 8);
  __m256 acc[8];
  for (int a = 0; a < 8; ++a) acc[a] = _mm256_setzero_ps();
  const void* wr[J];
  for (int jj = 0; jj < J; ++jj) wr[jj] = Row<T>(w, j0 + jj, ldw);
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(xs[r] + i);
    for (int jj = 0; jj < J; ++jj) {
      const __m256 wv = Load8<T>(wr[jj], i);
      for (int r = 0; r < R; ++r) acc[jj * R + r] = _mm256_fmadd_ps(wv, xv[r], acc[jj * R + r]);
    }
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, Reduce8(acc));
  for (int jj = 0; jj < J; ++jj)
    for (int r = 0; r < R; ++r) {
      float v = sums[jj * R + r];
      for (int64_t k = i; k < in; ++k) v += Scalar<T>(wr[jj], k) * xs[r][k];
      y[r * ldy + j0 + jj] = v;
    }
}

// Weight rows [j0, j1) against R activation rows: J = 8/R weight rows per tile, then single rows.
template <DType T, int R>
void Rows(const float* const* xs, const void* w, int64_t ldw, int64_t j0, int64_t j1, int64_t in, float* y,
          int64_t ldy) {
  constexpr int J = R == 1 ? 8 : R == 2 ? 4 : 2;
  int64_t j = j0;
  for (; j + J <= j1; j += J) Tile<T, R, J>(xs, w, ldw, j, in, y, ldy);
  for (; j < j1; ++j) Tile<T, R, 1>(xs, w, ldw, j, in, y, ldy);
}

template <DType T>
void Run(const float* x, int64_t ldx, int64_t m, const void* w, int64_t ldw, int64_t out, int64_t in, float* y,
         int64_t ldy) {
  // Tasks are blocks of output rows; each walks the activation rows in groups of up to 4, so a weight row
  // is read from memory once per 4 activation rows (and stays in L1 for the next group).
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (out + kBlock - 1) / kBlock;
  ParallelFor(blocks, out * in * m, [&](int64_t b) {
    const int64_t j0 = b * kBlock, j1 = std::min(out, j0 + kBlock);
    for (int64_t r0 = 0; r0 < m; r0 += 4) {
      const int R = static_cast<int>(std::min<int64_t>(4, m - r0));
      const float* xs[4];
      for (int r = 0; r < R; ++r) xs[r] = x + (r0 + r) * ldx;
      float* yr = y + r0 * ldy;
      switch (R) {
        case 4: Rows<T, 4>(xs, w, ldw, j0, j1, in, yr, ldy); break;
        case 3: Rows<T, 3>(xs, w, ldw, j0, j1, in, yr, ldy); break;
        case 2: Rows<T, 2>(xs, w, ldw, j0, j1, in, yr, ldy); break;
        default: Rows<T, 1>(xs, w, ldw, j0, j1, in, yr, ldy); break;
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

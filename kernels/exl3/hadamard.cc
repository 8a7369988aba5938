#include "kernels/exl3/hadamard.h"

#include <immintrin.h>

#include <stdexcept>
#include <string>

namespace dsmesh {
void Hadamard128(float* v, float scale) {
  __m256 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm256_loadu_ps(v + 8 * i);
  for (int i = 0; i < 16; ++i) {
    // stride 1: partner is the neighbour; even lanes take a + b, odd lanes partner - self = a - b.
    __m256 sw = _mm256_permute_ps(r[i], 0xB1);
    r[i] = _mm256_blend_ps(_mm256_add_ps(r[i], sw), _mm256_sub_ps(sw, r[i]), 0xAA);
    // stride 2
    sw = _mm256_permute_ps(r[i], 0x4E);
    r[i] = _mm256_blend_ps(_mm256_add_ps(r[i], sw), _mm256_sub_ps(sw, r[i]), 0xCC);
    // stride 4: swap 128-bit halves
    sw = _mm256_permute2f128_ps(r[i], r[i], 0x01);
    r[i] = _mm256_blend_ps(_mm256_add_ps(r[i], sw), _mm256_sub_ps(sw, r[i]), 0xF0);
  }
  // strides 8..64 pair whole vectors
  for (int s = 1; s < 16; s <<= 1) {
    for (int i = 0; i < 16; ++i) {
      if (i & s) continue;
      const __m256 a = r[i], b = r[i + s];
      r[i] = _mm256_add_ps(a, b);
      r[i + s] = _mm256_sub_ps(a, b);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
  for (int i = 0; i < 16; ++i) _mm256_storeu_ps(v + 8 * i, _mm256_mul_ps(r[i], sc));
}

void Hadamard128Rows(float* x, int64_t rows, int64_t cols, float scale) {
  if (cols % 128 != 0) throw std::invalid_argument("Hadamard128Rows: cols=" + std::to_string(cols) + " not a multiple of 128");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 128) Hadamard128(x + r * cols + c, scale);
}

void HadamardR128Fp16(const uint16_t* x, uint16_t* y, int64_t rows, int64_t cols, float scale) {
  if (cols % 128 != 0) throw std::invalid_argument("HadamardR128Fp16: cols=" + std::to_string(cols) + " not a multiple of 128");
  const float r_scale = scale * kHadamard128Scale;  // fp32 product, as in hadamard.cu
  float buf[128];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; c += 128) {
      const uint16_t* src = x + r * cols + c;
      for (int i = 0; i < 128; ++i) buf[i] = _cvtsh_ss(src[i]);
      Hadamard128(buf, r_scale);
      uint16_t* dst = y + r * cols + c;
      for (int i = 0; i < 128; ++i) dst[i] = _cvtss_sh(buf[i], _MM_FROUND_TO_NEAREST_INT);
    }
  }
}

}  // namespace dsmesh

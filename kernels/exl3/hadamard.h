// The 128-point Hadamard transform used on both sides of every EXL3 linear (docs/exl3-format.md §3).
//
// H128 is the Sylvester matrix in natural order, H[a][b] = (-1)^popcount(a & b), applied blockwise over
// 128 consecutive elements. The butterflies run in fp32 in exllamav3's order (strides 1, 2, 4, ..., 64;
// the lower index gets a + b, the upper a - b), so results are bit-identical to `had_r_128`.
#pragma once

#include <cstdint>

namespace dsmesh {

// 1/sqrt(128) as exllamav3 spells it (`had_r_128` multiplies its `scale` argument by this).
constexpr float kHadamard128Scale = 0.088388347648f;

// In place: v[0..127] <- H128 v (unnormalized butterflies), then v *= scale in fp32.
void Hadamard128(float* v, float scale);

// Every 128-element block of a rows x cols row-major matrix (cols % 128 == 0), in place.
void Hadamard128Rows(float* x, int64_t rows, int64_t cols, float scale);

// Bit-exact emulation of exllamav3 `had_r_128(x, y, pre_scale=None, post_scale=None, scale)` on fp16
// data: fp16 -> fp32, butterflies, multiply by fp32(scale * 0.088388347648f), round to fp16 (RNE).
void HadamardR128Fp16(const uint16_t* x, uint16_t* y, int64_t rows, int64_t cols, float scale);

}  // namespace dsmesh

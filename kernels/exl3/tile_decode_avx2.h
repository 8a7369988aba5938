// Fast AVX2 decode of one trellis tile into fp32, for the CPU linear (internal to kernels/exl3).
//
// Output layout ("group order"): 32 vectors of 8 floats. Vector q holds sequence positions 8q..8q+7 in
// lane order e = 0,4,1,5,2,6,3,7, i.e. tile cells
//   (r0,c0) (r0,c0+8) (r0+1,c0) (r0+1,c0+8) (r0+8,c0) (r0+8,c0+8) (r0+9,c0) (r0+9,c0+8)
// with r0 = 2 (q % 4), c0 = q / 4 (docs/exl3-format.md §2.4). Even lanes belong to column c0, odd lanes to
// column c0 + 8; the four vectors q = 4 c0 .. 4 c0 + 3 cover all 16 rows of those two columns.
// Values equal the fp16 codebook entries exactly (rounded to fp16, then widened).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/exl3/codebook.h"

namespace dsmesh::exl3_internal {

// Row of lane l of a group-order vector with r0 = 0 (add 2 (q % 4)); column of lane l with c0 = 0.
constexpr int kLaneRow[8] = {0, 0, 1, 1, 8, 8, 9, 9};
constexpr int kLaneCol[8] = {0, 8, 0, 8, 0, 8, 0, 8};

// Codebook on 8 states (32-bit lanes holding 16-bit states) -> 8 fp16-exact floats.
template <Exl3Codebook CB>
inline __m256 CodebookF32x8(__m256i s) {
  if constexpr (CB == Exl3Codebook::kMul1) {
    __m256i x = _mm256_mullo_epi32(s, _mm256_set1_epi32(static_cast<int>(kExl3Mul1Multiplier)));
    const __m256i m8 = _mm256_set1_epi32(0x00FF00FF);
    __m256i pairs = _mm256_add_epi32(_mm256_and_si256(x, m8), _mm256_and_si256(_mm256_srli_epi32(x, 8), m8));
    __m256i b = _mm256_add_epi32(_mm256_and_si256(pairs, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(pairs, 16));
    __m256 h = _mm256_cvtepi32_ps(_mm256_add_epi32(b, _mm256_set1_epi32(1024)));
    // Exact in fp32 (see codebook.cc); the only rounding is the fp16 one below.
    __m256 v = _mm256_fmadd_ps(h, _mm256_set1_ps(0.00676727294921875f), _mm256_set1_ps(-10.3828125f));
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else {
    __m256i x;
    if constexpr (CB == Exl3Codebook::kMcg) {
      x = _mm256_mullo_epi32(s, _mm256_set1_epi32(static_cast<int>(kExl3McgMultiplier)));
    } else {
      x = _mm256_add_epi32(_mm256_mullo_epi32(s, _mm256_set1_epi32(89226354)), _mm256_set1_epi32(64248484));
    }
    x = _mm256_xor_si256(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0x8FFF8FFFu))),
                         _mm256_set1_epi32(0x3B603B60));
    // Per 128-bit lane: low halves to bytes 0..7, high halves to bytes 8..15; then gather the two
    // 64-bit low parts into the low 128 bits and the high parts into the high 128 bits.
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,  //
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    x = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(x, split), 0xD8);
    __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(x));
    __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(x, 1));
    return _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_add_ps(lo, hi), _MM_FROUND_TO_NEAREST_INT));
  }
}

// The tile's bitstream as bytes in stream order, preceded by its last two bytes (the wrap-around of the
// first windows) and followed by 8 bytes of zeros so that 8-byte loads never run off the end.
struct TileStream {
  alignas(32) uint8_t bytes[2 + 256 + 8 + 22];
};

inline void LoadTileStream(const uint16_t* tile, int K, TileStream* ts) {
  // Stream byte order = big-endian bytes of each little-endian 32-bit word.
  const __m256i bswap32 = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,  //
                                           3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
  uint8_t* body = ts->bytes + 2;
  for (int v = 0; v < K; ++v) {  // 32 K bytes = K vectors
    __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile) + v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(body) + v, _mm256_shuffle_epi8(w, bswap32));
  }
  const int n = 32 * K;
  ts->bytes[0] = body[n - 2];
  ts->bytes[1] = body[n - 1];
  std::memset(body + n, 0, 8);
}

inline uint64_t LoadBE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}

// States of positions 8g..8g+7 in lane order 0,4,1,5,2,6,3,7. Buffer bit P of the stream buffer is
// stream bit P - 16; the window of position t starts at buffer bit (t+1)K. Four consecutive windows
// (3K + 16 bits plus up to 7 bits of misalignment <= 47 bits) fit one 64-bit load.
template <int K>
inline __m256i StatesOfGroup(const TileStream& ts, int g) {
  constexpr int kOff0 = K, kOff1 = 5 * K;  // buffer bit of the first window of each half, minus 8gK
  constexpr int kB0 = kOff0 >> 3, kB1 = kOff1 >> 3, kO0 = kOff0 & 7, kO1 = kOff1 & 7;
  const uint64_t v0 = LoadBE64(ts.bytes + g * K + kB0);
  const uint64_t v1 = LoadBE64(ts.bytes + g * K + kB1);
  const __m256i sh0 = _mm256_setr_epi64x(48 - kO0, 48 - kO0 - K, 48 - kO0 - 2 * K, 48 - kO0 - 3 * K);
  const __m256i sh1 = _mm256_setr_epi64x(48 - kO1, 48 - kO1 - K, 48 - kO1 - 2 * K, 48 - kO1 - 3 * K);
  __m256i a = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(v0)), sh0);
  __m256i b = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(v1)), sh1);
  __m256i s = _mm256_blend_epi32(a, _mm256_slli_epi64(b, 32), 0xAA);
  return _mm256_and_si256(s, _mm256_set1_epi32(0xFFFF));
}

// Decodes one packed tile into 32 group-order vectors (256 floats at out, 32-byte aligned).
template <int K, Exl3Codebook CB>
inline void DecodeTileGroupOrder(const uint16_t* tile, float* out) {
  TileStream ts;
  LoadTileStream(tile, K, &ts);
  for (int g = 0; g < 32; ++g) _mm256_store_ps(out + 8 * g, CodebookF32x8<CB>(StatesOfGroup<K>(ts, g)));
}

// Dispatch on runtime K and codebook to a function template F<K, CB>::Run(args...).
template <template <int, Exl3Codebook> class F, class... Args>
inline void DispatchK(int K, Exl3Codebook cb, Args&&... args) {
#define DSMESH_EXL3_CASE(k)                                                            \
  case k:                                                                              \
    switch (cb) {                                                                      \
      case Exl3Codebook::k3Inst: return F<k, Exl3Codebook::k3Inst>::Run(args...);      \
      case Exl3Codebook::kMcg: return F<k, Exl3Codebook::kMcg>::Run(args...);          \
      case Exl3Codebook::kMul1: return F<k, Exl3Codebook::kMul1>::Run(args...);        \
    }                                                                                  \
    break;
  switch (K) {
    DSMESH_EXL3_CASE(1)
    DSMESH_EXL3_CASE(2)
    DSMESH_EXL3_CASE(3)
    DSMESH_EXL3_CASE(4)
    DSMESH_EXL3_CASE(5)
    DSMESH_EXL3_CASE(6)
    DSMESH_EXL3_CASE(7)
    DSMESH_EXL3_CASE(8)
  }
#undef DSMESH_EXL3_CASE
}

}  // namespace dsmesh::exl3_internal

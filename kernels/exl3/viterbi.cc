#include "kernels/exl3/viterbi.h"

#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

namespace dsmesh {
namespace {

void* AlignedAlloc(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return p;
}

// cost_{t-1} values for 8 consecutive edges e0..e0+7 (e0 % 8 == 0) given predecessor index base
// (kappa << (16-2K)) | (e0 >> K): lane l needs prev[base + (l >> K)].
template <int K>
inline __m256 PrevLanes(const float* prev, uint32_t base) {
  if constexpr (K >= 3) {
    return _mm256_broadcast_ss(prev + base);
  } else if constexpr (K == 2) {
    const __m256 two = _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(prev + base)));
    return _mm256_permutevar8x32_ps(two, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  } else {
    const __m256 four = _mm256_castps128_ps256(_mm_loadu_ps(prev + base));
    return _mm256_permutevar8x32_ps(four, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
  }
}

template <int K>
void StepK(const float* table, float target, const float* prev, float* cur, uint8_t* bp) {
  constexpr uint32_t kEdges = 1u << (16 - K), kKappas = 1u << K;
  const __m256 w = _mm256_set1_ps(target);
  // Two 8-edge blocks per iteration so each codebook access uses a whole 64-byte line.
  for (uint32_t e0 = 0; e0 < kEdges; e0 += 16) {
    __m256 best0 = _mm256_set1_ps(std::numeric_limits<float>::infinity()), best1 = best0;
    __m256i arg0 = _mm256_setzero_si256(), arg1 = arg0;
    for (uint32_t kappa = 0; kappa < kKappas; ++kappa) {
      const float* cb = table + (kappa << (16 - K)) + e0;
      const uint32_t pbase = (kappa << (16 - 2 * K)) | (e0 >> K);
      const __m256 p0 = PrevLanes<K>(prev, pbase);
      const __m256 p1 = PrevLanes<K>(prev, pbase + (8 >> K));
      const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(cb), w);
      const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(cb + 8), w);
      const __m256 c0 = _mm256_fmadd_ps(d0, d0, p0);
      const __m256 c1 = _mm256_fmadd_ps(d1, d1, p1);
      const __m256i kv = _mm256_set1_epi32(static_cast<int>(kappa));
      const __m256 lt0 = _mm256_cmp_ps(c0, best0, _CMP_LT_OQ);  // strict: ties keep the first kappa
      const __m256 lt1 = _mm256_cmp_ps(c1, best1, _CMP_LT_OQ);
      best0 = _mm256_blendv_ps(best0, c0, lt0);
      best1 = _mm256_blendv_ps(best1, c1, lt1);
      arg0 = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(arg0), _mm256_castsi256_ps(kv), lt0));
      arg1 = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(arg1), _mm256_castsi256_ps(kv), lt1));
    }
    _mm256_store_ps(cur + e0, best0);
    _mm256_store_ps(cur + e0 + 8, best1);
    // 16 x int32 -> 16 x uint8 back-pointers.
    const __m256i packed16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(arg0, arg1), 0xD8);
    const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(packed16), _mm256_extracti128_si256(packed16, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bp + e0), bytes);
  }
}

}  // namespace

Exl3TileEncoder::Exl3TileEncoder(int K, Exl3Codebook codebook)
    : K_(K), codebook_(codebook), edges_(1u << (16 - K)), table_(Exl3CodebookTableF32(codebook)) {
  if (K < 1 || K > 8) throw std::invalid_argument("Exl3TileEncoder: K=" + std::to_string(K) + " out of range 1..8");
  cost_[0] = static_cast<float*>(AlignedAlloc(edges_ * sizeof(float)));
  cost_[1] = static_cast<float*>(AlignedAlloc(edges_ * sizeof(float)));
  bp_ = static_cast<uint8_t*>(AlignedAlloc(static_cast<size_t>(256) * edges_));
}

Exl3TileEncoder::~Exl3TileEncoder() {
  std::free(cost_[0]);
  std::free(cost_[1]);
  std::free(bp_);
}

void Exl3TileEncoder::Step(float target, const float* prev, float* cur, uint8_t* bp) const {
  switch (K_) {
    case 1: return StepK<1>(table_, target, prev, cur, bp);
    case 2: return StepK<2>(table_, target, prev, cur, bp);
    case 3: return StepK<3>(table_, target, prev, cur, bp);
    case 4: return StepK<4>(table_, target, prev, cur, bp);
    case 5: return StepK<5>(table_, target, prev, cur, bp);
    case 6: return StepK<6>(table_, target, prev, cur, bp);
    case 7: return StepK<7>(table_, target, prev, cur, bp);
    case 8: return StepK<8>(table_, target, prev, cur, bp);
  }
}

void Exl3TileEncoder::Trace(int first, int last, uint32_t edge, uint16_t* states_by_step) const {
  for (int step = last; step >= first; --step) {
    const uint32_t kappa = bp_[static_cast<size_t>(step) * edges_ + edge];
    const uint32_t state = (kappa << (16 - K_)) | edge;
    states_by_step[step] = static_cast<uint16_t>(state);
    edge = state >> K_;
  }
}

double Exl3TileEncoder::Encode(const float targets[256], uint16_t states[256]) {
  // Pass 1: positions 128..255, 0..127 (step i handles position (128 + i) % 256), free start.
  std::memset(cost_[0], 0, edges_ * sizeof(float));
  for (int step = 0; step < 256; ++step)
    Step(targets[(128 + step) % 256], cost_[step & 1], cost_[(step + 1) & 1], bp_ + static_cast<size_t>(step) * edges_);
  const float* final_cost = cost_[256 & 1];
  uint32_t best_edge = 0;
  for (uint32_t e = 1; e < edges_; ++e)
    if (final_cost[e] < final_cost[best_edge]) best_edge = e;
  uint16_t pass1[256];
  Trace(128, 255, best_edge, pass1);               // steps 128..255 = positions 0..127
  const uint32_t forced_edge = pass1[128] >> K_;  // edge of position 255 that position 0 continues

  // Pass 2: positions 0..255, predecessor of position 0 forced to forced_edge.
  const float inf = std::numeric_limits<float>::infinity();
  for (uint32_t e = 0; e < edges_; ++e) cost_[0][e] = e == forced_edge ? 0.0f : inf;
  for (int t = 0; t < 256; ++t) Step(targets[t], cost_[t & 1], cost_[(t + 1) & 1], bp_ + static_cast<size_t>(t) * edges_);
  Trace(0, 255, forced_edge, states);

  double err = 0;
  for (int t = 0; t < 256; ++t) {
    const double d = double(table_[states[t]]) - targets[t];
    err += d * d;
  }
  return err;
}

}  // namespace dsmesh

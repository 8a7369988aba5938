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

// Four independent 8-edge blocks per kappa loop: the running minimum is a serial dependency per block,
// so several blocks in flight keep the vector units busy (and each codebook access uses a whole line).
constexpr int kBlocks = 4;

template <int K>
void StepK(const float* table, float target, const float* prev, float* cur, uint8_t* bp) {
  constexpr uint32_t kEdges = 1u << (16 - K), kKappas = 1u << K, kSpan = 8 * kBlocks;
  const __m256 w = _mm256_set1_ps(target);
  for (uint32_t e0 = 0; e0 < kEdges; e0 += kSpan) {
    __m256 best[kBlocks];
    __m256i arg[kBlocks];
    for (int b = 0; b < kBlocks; ++b) {
      best[b] = _mm256_set1_ps(std::numeric_limits<float>::infinity());
      arg[b] = _mm256_setzero_si256();
    }
    for (uint32_t kappa = 0; kappa < kKappas; ++kappa) {
      const float* cb = table + (kappa << (16 - K)) + e0;
      const uint32_t pbase = (kappa << (16 - 2 * K)) | (e0 >> K);
      const __m256i kv = _mm256_set1_epi32(static_cast<int>(kappa));
      for (int b = 0; b < kBlocks; ++b) {
        const __m256 p = PrevLanes<K>(prev, pbase + ((8 * b) >> K));
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(cb + 8 * b), w);
        const __m256 c = _mm256_fmadd_ps(d, d, p);
        const __m256 lt = _mm256_cmp_ps(c, best[b], _CMP_LT_OQ);  // strict: ties keep the first kappa
        best[b] = _mm256_min_ps(c, best[b]);
        arg[b] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(arg[b]), _mm256_castsi256_ps(kv), lt));
      }
    }
    for (int b = 0; b < kBlocks; b += 2) {
      _mm256_store_ps(cur + e0 + 8 * b, best[b]);
      _mm256_store_ps(cur + e0 + 8 * b + 8, best[b + 1]);
      // 16 x int32 -> 16 x uint8 back-pointers.
      const __m256i packed16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(arg[b], arg[b + 1]), 0xD8);
      const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(packed16), _mm256_extracti128_si256(packed16, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bp + e0 + 8 * b), bytes);
    }
  }
}

// The same step with 16-lane AVX-512 vectors (compiled for that target only; chosen at run time).
#define DSMESH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

template <int K>
DSMESH_AVX512 inline __m512 PrevLanes512(const float* prev, uint32_t base) {
  if constexpr (K >= 4) {
    return _mm512_set1_ps(prev[base]);
  } else {
    // lane l needs prev[base + (l >> K)]; at most 8 distinct values (cost rows are padded for this load).
    const __m512i idx = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), K);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(_mm256_loadu_ps(prev + base)));
  }
}

template <int K>
DSMESH_AVX512 void StepK512(const float* table, float target, const float* prev, float* cur, uint8_t* bp) {
  constexpr uint32_t kEdges = 1u << (16 - K), kKappas = 1u << K, kSpan = 16 * kBlocks;
  const __m512 w = _mm512_set1_ps(target);
  for (uint32_t e0 = 0; e0 < kEdges; e0 += kSpan) {
    __m512 best[kBlocks];
    __m512i arg[kBlocks];
    for (int b = 0; b < kBlocks; ++b) {
      best[b] = _mm512_set1_ps(std::numeric_limits<float>::infinity());
      arg[b] = _mm512_setzero_si512();
    }
    for (uint32_t kappa = 0; kappa < kKappas; ++kappa) {
      const float* cb = table + (kappa << (16 - K)) + e0;
      const uint32_t pbase = (kappa << (16 - 2 * K)) | (e0 >> K);
      const __m512i kv = _mm512_set1_epi32(static_cast<int>(kappa));
      for (int b = 0; b < kBlocks; ++b) {
        const __m512 p = PrevLanes512<K>(prev, pbase + ((16 * b) >> K));
        const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(cb + 16 * b), w);
        const __m512 c = _mm512_fmadd_ps(d, d, p);
        const __mmask16 lt = _mm512_cmp_ps_mask(c, best[b], _CMP_LT_OQ);  // strict: ties keep the first kappa
        best[b] = _mm512_min_ps(c, best[b]);
        arg[b] = _mm512_mask_mov_epi32(arg[b], lt, kv);
      }
    }
    for (int b = 0; b < kBlocks; ++b) {
      _mm512_store_ps(cur + e0 + 16 * b, best[b]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bp + e0 + 16 * b), _mm512_cvtepi32_epi8(arg[b]));
    }
  }
}

bool CpuHasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has;
}

}  // namespace

bool Exl3EncoderCanUseAvx512() { return CpuHasAvx512(); }

Exl3TileEncoder::Exl3TileEncoder(int K, Exl3Codebook codebook, bool allow_avx512)
    : K_(K), codebook_(codebook), edges_(1u << (16 - K)), table_(Exl3CodebookTableF32(codebook)),
      avx512_(allow_avx512 && CpuHasAvx512()) {
  if (K < 1 || K > 8) throw std::invalid_argument("Exl3TileEncoder: K=" + std::to_string(K) + " out of range 1..8");
  // +16 floats: the AVX-512 step's 8-float predecessor loads may run past the last edge (values unused).
  cost_[0] = static_cast<float*>(AlignedAlloc((edges_ + 16) * sizeof(float)));
  cost_[1] = static_cast<float*>(AlignedAlloc((edges_ + 16) * sizeof(float)));
  std::memset(cost_[0], 0, (edges_ + 16) * sizeof(float));
  std::memset(cost_[1], 0, (edges_ + 16) * sizeof(float));
  bp_ = static_cast<uint8_t*>(AlignedAlloc(static_cast<size_t>(256) * edges_));
}

Exl3TileEncoder::~Exl3TileEncoder() {
  std::free(cost_[0]);
  std::free(cost_[1]);
  std::free(bp_);
}

void Exl3TileEncoder::Step(float target, const float* prev, float* cur, uint8_t* bp) const {
  if (avx512_) {
    switch (K_) {
      case 1: return StepK512<1>(table_, target, prev, cur, bp);
      case 2: return StepK512<2>(table_, target, prev, cur, bp);
      case 3: return StepK512<3>(table_, target, prev, cur, bp);
      case 4: return StepK512<4>(table_, target, prev, cur, bp);
      case 5: return StepK512<5>(table_, target, prev, cur, bp);
      case 6: return StepK512<6>(table_, target, prev, cur, bp);
      case 7: return StepK512<7>(table_, target, prev, cur, bp);
      case 8: return StepK512<8>(table_, target, prev, cur, bp);
    }
  }
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

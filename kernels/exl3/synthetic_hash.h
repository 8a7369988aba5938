// The seeded hashes behind synthetic EXL3 weights (synthetic_exl3.h), host and device alike: each value
// depends only on the seed and its position, so any block of a linear can be generated on its own.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define DSMESH_HD __host__ __device__
#else
#define DSMESH_HD
#endif

namespace dsmesh {

DSMESH_HD inline uint64_t SyntheticMix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Word w (0 .. 16K-1) of tile (i, j) of a linear with tiles_n tile columns.
DSMESH_HD inline uint16_t SyntheticTrellisWord(uint64_t seed, int64_t i, int64_t j, int64_t tiles_n, int K, int w) {
  const uint64_t index = (static_cast<uint64_t>(i) * tiles_n + j) * (16ull * K) + w;
  return static_cast<uint16_t>(SyntheticMix(seed ^ (index * 0xD1B54A32D192ED03ull)) >> 48);
}

// The sign of suh[i] (which = 0) or svh[i] (which = 1): +1 or -1.
DSMESH_HD inline float SyntheticSign(uint64_t seed, int which, int64_t i) {
  return (SyntheticMix(seed ^ (0xA5A5A5A5ull + which) ^ (static_cast<uint64_t>(i) << 20)) >> 63) ? -1.0f : 1.0f;
}

// suh's magnitude for a linear of padded input size k.
DSMESH_HD inline float SyntheticSuhScale(int64_t k) { return 1.0f / sqrtf(static_cast<float>(k)); }

}  // namespace dsmesh

// Greedy token choice over a logits row, shared by the worker's sampler and `dsmesh generate`.
#pragma once

#include <cstdint>
#include <limits>

namespace dsmesh {

// Lowest index of the largest value. Two passes: a max over 8 independent lanes (vectorizes; the naive
// loop carries a dependency through a load of v[best] each iteration and ran ~10x slower at vocab 129280),
// then the first index holding that max. NaNs are never chosen (unless everything is NaN: index 0).
inline int32_t Argmax(const float* v, int64_t n) {
  float lane[8];
  for (float& l : lane) l = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] = v[i + j] > lane[j] ? v[i + j] : lane[j];
  float mx = lane[0];
  for (int j = 1; j < 8; ++j) mx = lane[j] > mx ? lane[j] : mx;
  for (; i < n; ++i) mx = v[i] > mx ? v[i] : mx;
  for (int64_t k = 0; k < n; ++k)
    if (v[k] == mx) return static_cast<int32_t>(k);
  return 0;
}

}  // namespace dsmesh

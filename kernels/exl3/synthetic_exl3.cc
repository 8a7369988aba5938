#include "kernels/exl3/synthetic_exl3.h"

#include <cmath>
#include <stdexcept>

#include "common/half.h"
#include "kernels/exl3/parallel.h"

namespace dsmesh {

Exl3Weight SyntheticExl3Weight(const std::string& name, int64_t in_features, int64_t out_features, int K,
                               uint64_t seed) {
  if (K < 1 || K > 8) throw std::invalid_argument(name + ": synthetic EXL3 needs K in 1..8, got " + std::to_string(K));
  Exl3Weight w;
  w.name = name;
  w.K = K;
  w.codebook = Exl3Codebook::kMcg;
  w.in_features = in_features;
  w.out_features = out_features;
  const int64_t k = (in_features + 127) / 128 * 128, n = (out_features + 127) / 128 * 128;
  const int64_t tiles_k = k / 16, tiles_n = n / 16;
  w.trellis = AllocateTensor(DType::kI16, {tiles_k, tiles_n, 16LL * K});
  uint16_t* t = static_cast<uint16_t*>(w.trellis.data);
  Exl3ParallelFor(tiles_k, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = 0; j < tiles_n; ++j)
        for (int x = 0; x < 16 * K; ++x) t[(i * tiles_n + j) * 16 * K + x] = SyntheticTrellisWord(seed, i, j, tiles_n, K, x);
  });
  w.suh = AllocateTensor(DType::kF16, {k});
  w.svh = AllocateTensor(DType::kF16, {n});
  const float s = SyntheticSuhScale(k);
  for (int64_t i = 0; i < k; ++i) static_cast<uint16_t*>(w.suh.data)[i] = FloatToFp16(SyntheticSign(seed, 0, i) * s);
  for (int64_t j = 0; j < n; ++j) static_cast<uint16_t*>(w.svh.data)[j] = FloatToFp16(SyntheticSign(seed, 1, j));
  return w;
}

}  // namespace dsmesh

#include "kernels/exl3/quantize_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include "common/half.h"
#include "kernels/exl3/hadamard.h"
#include "kernels/exl3/parallel.h"
#include "kernels/exl3/trellis.h"
#include "kernels/exl3/viterbi.h"

namespace dsmesh {
namespace {

double CodebookStd(Exl3Codebook cb) {
  // Over all 65536 states (docs/exl3-format.md §2.5); 3INST's is exllamav3's codebook_scale.
  switch (cb) {
    case Exl3Codebook::k3Inst: return kExl3CodebookScale;
    case Exl3Codebook::kMcg: return 1.24411;
    case Exl3Codebook::kMul1: return 1.00031;
  }
  return 1.0;
}

// x[r][:] <- H x over every 128-row block (left multiplication by Hk), columns independent; same fp32
// butterfly order as Hadamard128 on each column.
void ColumnHadamard128(float* x, int64_t rows, int64_t cols, float scale) {
  for (int64_t b = 0; b < rows; b += 128) {
    for (int s = 1; s < 128; s <<= 1)
      for (int i = 0; i < 128; ++i) {
        if (i & s) continue;
        float* ra = x + (b + i) * cols;
        float* rb = x + (b + i + s) * cols;
        for (int64_t c = 0; c < cols; ++c) {
          const float a = ra[c], bb = rb[c];
          ra[c] = a + bb;
          rb[c] = a - bb;
        }
      }
    for (int64_t i = 0; i < 128 * cols; ++i) x[b * cols + i] *= scale;
  }
}

// Sequence-order targets of tile (i, j) of a row-major k x n matrix.
void GatherTile(const float* w, int64_t n, int64_t i, int64_t j, float out[256]) {
  for (int t = 0; t < 256; ++t) out[t] = w[(16 * i + Exl3TileRow(t)) * n + 16 * j + Exl3TileCol(t)];
}

Tensor HalfTensor(const std::vector<float>& v) {
  Tensor t = AllocateTensor(DType::kF16, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.as<uint16_t>()[i] = FloatToFp16(v[i]);
  return t;
}

// Mean squared Viterbi error per weight of the sample tiles scaled by g.
double SampleError(const std::vector<std::vector<float>>& tiles, float g, int K, Exl3Codebook cb) {
  std::vector<double> errs(tiles.size());
  Exl3ParallelFor(static_cast<int64_t>(tiles.size()), [&](int64_t t0, int64_t t1, int) {
    Exl3TileEncoder enc(K, cb);
    float scaled[256];
    uint16_t states[256];
    for (int64_t t = t0; t < t1; ++t) {
      for (int i = 0; i < 256; ++i) scaled[i] = tiles[t][i] * g;
      errs[t] = enc.Encode(scaled, states) / (double(g) * g);  // error in unscaled units
    }
  });
  double sum = 0;
  for (double e : errs) sum += e;
  return sum / (256.0 * tiles.size());
}

}  // namespace

double Exl3DefaultGlobalScale(int K) {
  // `exl3_encoder_benchmark --calibrate-scale`: the g minimizing the MSE of i.i.d. Gaussian tiles at the
  // codebook's RMS (MCG and MUL1 agree within 0.05).
  static const double kScale[9] = {1.0, 1.1, 1.0, 0.9, 0.92, 0.93, 0.87, 0.88, 0.88};
  return (K >= 1 && K <= 8) ? kScale[K] : 1.0;
}

Exl3Weight Exl3QuantizedLinear::AsWeight() const {
  Exl3Weight w;
  w.in_features = in_features;
  w.out_features = out_features;
  w.K = K;
  w.codebook = codebook;
  w.trellis = trellis;
  w.suh = suh;
  w.svh = svh;
  return w;
}

double EncodeExl3Tiles(const float* w, int64_t k, int64_t n, int K, Exl3Codebook codebook, uint16_t* trellis,
                       const std::function<void(int64_t, int64_t)>& progress) {
  if (k % 16 || n % 16) throw std::invalid_argument("EncodeExl3Tiles: k and n must be multiples of 16");
  const int64_t tiles_n = n / 16, total = (k / 16) * tiles_n;
  std::atomic<int64_t> done{0};
  std::vector<double> errs(total);
  Exl3ParallelFor(total, [&](int64_t t0, int64_t t1, int thread) {
    Exl3TileEncoder enc(K, codebook);
    float targets[256];
    uint16_t states[256];
    for (int64_t t = t0; t < t1; ++t) {
      GatherTile(w, n, t / tiles_n, t % tiles_n, targets);
      errs[t] = enc.Encode(targets, states);
      Exl3PackTileStates(states, K, trellis + t * 16 * K);
      const int64_t now = ++done;
      if (thread == 0 && progress) progress(now, total);
    }
  });
  if (progress) progress(total, total);
  double sum = 0;
  for (double e : errs) sum += e;
  return sum;
}

Exl3QuantizedLinear QuantizeExl3Linear(const float* weight, int64_t out_features, int64_t in_features,
                                       const Exl3QuantOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  if (out_features <= 0 || in_features <= 0) throw std::invalid_argument("QuantizeExl3Linear: empty weight");
  if (opt.K < 1 || opt.K > 8) throw std::invalid_argument("QuantizeExl3Linear: K=" + std::to_string(opt.K) + " out of range 1..8");
  const int64_t k = (in_features + 127) / 128 * 128, n = (out_features + 127) / 128 * 128;
  const double cb_std = CodebookStd(opt.codebook);

  // W is k x n (input x output), zero-padded.
  std::vector<float> W(static_cast<size_t>(k * n), 0.0f);
  for (int64_t o = 0; o < out_features; ++o)
    for (int64_t i = 0; i < in_features; ++i) {
      const float v = weight[o * in_features + i];
      if (!std::isfinite(v)) throw std::runtime_error("QuantizeExl3Linear: non-finite weight at [" + std::to_string(o) + ", " + std::to_string(i) + "]");
      W[i * n + o] = v;
    }

  std::mt19937_64 rng(opt.seed * 0x9E3779B97F4A7C15ull + 1);
  auto sign = [&] { return (rng() & 1) ? 1.0f : -1.0f; };

  // 1-2. Output scales and the output-side rotation.
  std::vector<double> col_ms(n, 0.0);
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) col_ms[c] += double(W[r * n + c]) * W[r * n + c];
  double mean_rms = 0;
  int64_t nonzero_cols = 0;
  for (int64_t c = 0; c < n; ++c)
    if (col_ms[c] > 0) mean_rms += std::sqrt(col_ms[c] / k), ++nonzero_cols;
  mean_rms = nonzero_cols ? mean_rms / nonzero_cols : 1.0;
  std::vector<float> sv(n), sv_div(n);
  for (int64_t c = 0; c < n; ++c) {
    const float s = sign();
    if (col_ms[c] > 0) {
      sv[c] = Fp16ToFloat(FloatToFp16(static_cast<float>(s * std::sqrt(col_ms[c] / k) / mean_rms)));
      if (sv[c] == 0) sv[c] = s * 6.1035156e-05f;  // smallest normal fp16, for a column far below the mean
      sv_div[c] = sv[c];
    } else {
      sv[c] = 0.0f;  // padded or dead output: exactly zero
      sv_div[c] = 0.1f;
    }
  }
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) W[r * n + c] /= sv_div[c];
  Hadamard128Rows(W.data(), k, n, kHadamard128Scale);

  // 3. Input scales (rows to the codebook's RMS).
  std::vector<double> row_rms(k);
  for (int64_t r = 0; r < k; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < n; ++c) ms += double(W[r * n + c]) * W[r * n + c];
    row_rms[r] = std::sqrt(ms / n);
  }
  std::vector<float> su_sign(k);
  for (int64_t r = 0; r < k; ++r) su_sign[r] = sign();
  auto make_su = [&](double g) {
    std::vector<float> su(k);
    for (int64_t r = 0; r < k; ++r) {
      const double mag = row_rms[r] > 0 ? row_rms[r] / cb_std / g : 1.0;  // zero rows: any scale works
      float h = Fp16ToFloat(FloatToFp16(static_cast<float>(su_sign[r] * mag)));
      if (h == 0) h = su_sign[r] * 6.1035156e-05f;
      su[r] = h;
    }
    return su;
  };
  auto normalized = [&](const std::vector<float>& su) {
    std::vector<float> X(W.size());
    for (int64_t r = 0; r < k; ++r)
      for (int64_t c = 0; c < n; ++c) X[r * n + c] = W[r * n + c] / su[r];
    ColumnHadamard128(X.data(), k, n, kHadamard128Scale);
    return X;
  };

  // 4. Global scale. Tiles of a matrix below ~512 tiles use the Gaussian optimum for K; larger matrices
  //    try it and +-0.05 on a sample of tiles (a wrapped diagonal plus the highest- and lowest-RMS tile).
  double g = Exl3DefaultGlobalScale(opt.K);
  const int64_t strips = k / 16, tiles_n = n / 16;
  if (opt.search_scale && strips * tiles_n >= 512) {
    const std::vector<float> X = normalized(make_su(1.0));
    std::vector<std::pair<double, int64_t>> by_rms;
    for (int64_t t = 0; t < strips * tiles_n; ++t) {
      float tile[256];
      GatherTile(X.data(), n, t / tiles_n, t % tiles_n, tile);
      double ms = 0;
      for (float v : tile) ms += double(v) * v;
      by_rms.emplace_back(ms, t);
    }
    std::sort(by_rms.begin(), by_rms.end());
    std::vector<int64_t> pick = {by_rms.front().second, by_rms.back().second};
    const int64_t diag = std::max(strips, tiles_n);
    for (int64_t d = 0; d < diag && pick.size() < 8; d += std::max<int64_t>(1, diag / 6))
      pick.push_back((d % strips) * tiles_n + d % tiles_n);
    std::sort(pick.begin(), pick.end());
    pick.erase(std::unique(pick.begin(), pick.end()), pick.end());
    std::vector<std::vector<float>> tiles;
    for (int64_t t : pick) {
      tiles.emplace_back(256);
      GatherTile(X.data(), n, t / tiles_n, t % tiles_n, tiles.back().data());
    }
    const double g0 = g;
    double best_err = 1e300;
    for (double cand : {g0, g0 - 0.05, g0 + 0.05}) {
      const double e = SampleError(tiles, static_cast<float>(cand), opt.K, opt.codebook);
      if (e < best_err) best_err = e, g = cand;
    }
  }
  const std::vector<float> su = make_su(g);
  const std::vector<float> X = normalized(su);  // rows now have RMS ~ codebook std * g

  // 5. Encode every tile.
  Exl3QuantizedLinear q;
  q.in_features = in_features;
  q.out_features = out_features;
  q.K = opt.K;
  q.codebook = opt.codebook;
  q.trellis = AllocateTensor(DType::kI16, {k / 16, n / 16, 16 * opt.K});
  const double sq_err = EncodeExl3Tiles(X.data(), k, n, opt.K, opt.codebook, q.trellis.as<uint16_t>(), opt.progress);

  // 6. Scales.
  q.suh = HalfTensor(su);
  q.svh = HalfTensor(sv);
  double var = 0;
  for (float v : X) var += double(v) * v;
  q.stats.scale = g;
  q.stats.rotated_mse = sq_err / double(k * n);
  q.stats.rotated_var = var / double(k * n);
  q.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return q;
}

}  // namespace dsmesh

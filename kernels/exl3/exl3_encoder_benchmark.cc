// EXL3 encoder speed.
//   bazel run -c opt //kernels/exl3:exl3_encoder_benchmark            per-tile Viterbi time, K = 1..8
//   bazel run -c opt //kernels/exl3:exl3_encoder_benchmark -- --full   quantize a 4096 x 2048 Gaussian matrix
//                                                                      at K = 2 (MCG) with a progress bar
//   ... -- --calibrate-scale   Gaussian MSE versus global scale g per K (quantize_linear.cc's defaults)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/exl3/parallel.h"
#include "kernels/exl3/progress.h"
#include "kernels/exl3/quantize_linear.h"
#include "kernels/exl3/viterbi.h"

namespace dsmesh {
namespace {

void BM_Exl3TileEncode(benchmark::State& state) {
  const int K = static_cast<int>(state.range(0));
  const bool avx512 = state.range(1) != 0;
  if (avx512 && !Exl3EncoderCanUseAvx512()) {
    state.SkipWithError("no AVX-512 on this CPU");
    return;
  }
  Exl3TileEncoder enc(K, Exl3Codebook::kMcg, avx512);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  float targets[256];
  for (float& t : targets) t = nd(rng) * 1.244f;
  uint16_t states[256];
  for (auto _ : state) benchmark::DoNotOptimize(enc.Encode(targets, states));
  state.counters["tiles/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
  // Two passes x 256 positions x 2^16 candidate transitions per tile.
  state.counters["Gtransitions/s"] = benchmark::Counter(state.iterations() * 2.0 * 256 * 65536 / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Exl3TileEncode)->ArgNames({"K", "avx512"})->ArgsProduct({{1, 2, 3, 4, 5, 6, 7, 8}, {0, 1}})->Unit(benchmark::kMillisecond);

int RunFull() {
  const int64_t in = 4096, out = 2048;
  std::vector<float> w(in * out);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto& v : w) v = nd(rng) * 0.02f;
  ProgressBar bar("quantize 4096x2048 K=2");
  Exl3QuantOptions opt;
  opt.K = 2;
  opt.codebook = Exl3Codebook::kMcg;
  opt.progress = [&](int64_t done, int64_t total) { bar.Update(done, total); };
  const auto t0 = std::chrono::steady_clock::now();
  const Exl3QuantizedLinear q = QuantizeExl3Linear(w.data(), out, in, opt);
  bar.Finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("quantized 4096x2048 (in x out) at K=2, MCG, %d threads: %.1f s (%.0f tiles/s), rotated MSE/var %.4f, g %.3f\n",
              Exl3ThreadCount(), s, 32768 / s, q.stats.rotated_mse / q.stats.rotated_var, q.stats.scale);
  return 0;
}

// Where quantize_linear.cc's default global scales come from: normalized MSE of i.i.d. Gaussian tiles at
// the codebook's RMS, scaled by g before encoding, per K.
int RunCalibrateScale() {
  for (Exl3Codebook cb : {Exl3Codebook::kMcg, Exl3Codebook::kMul1}) {
    const float sd = cb == Exl3Codebook::kMul1 ? 1.00031f : 1.24411f;
    for (int K = 1; K <= 8; ++K) {
      std::mt19937 rng(K);
      std::normal_distribution<float> nd;
      const int tiles = 16;
      std::vector<float> w(tiles * 256);
      for (auto& v : w) v = nd(rng) * sd;
      std::printf("%s K=%d:", Exl3CodebookName(cb), K);
      double best = 1e9, best_g = 0;
      for (double g = 0.70; g < 1.101; g += 0.05) {
        std::vector<float> scaled(w.size());
        for (size_t i = 0; i < w.size(); ++i) scaled[i] = w[i] * static_cast<float>(g);
        std::vector<uint16_t> trellis(tiles * 16 * K);
        const double err = EncodeExl3Tiles(scaled.data(), 16 * tiles, 16, K, cb, trellis.data()) / (g * g);
        const double mse = err / (tiles * 256.0 * sd * sd);
        std::printf(" g=%.2f %.5f", g, mse);
        if (mse < best) best = mse, best_g = g;
      }
      std::printf("  -> best g %.2f\n", best_g);
    }
  }
  return 0;
}

}  // namespace
}  // namespace dsmesh

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--full") == 0) return dsmesh::RunFull();
    else if (std::strcmp(argv[i], "--calibrate-scale") == 0) return dsmesh::RunCalibrateScale();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}

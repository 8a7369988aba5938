// CPU EXL3 linear throughput: K = 2, 3, 6 (MCG) at k x n = 4096 x 2048, m = 1, 4, 16 rows.
// Reports GB/s of trellis bytes streamed and weights/s decoded (k*n per call; every row reuses the
// decoded tile). Later kernels (kernels/cuda) compare against these numbers. Rates use wall time; the CPU
// column sums all threads (DSMESH_CPU_THREADS=1 gives the single-core figure).
//   bazel run -c opt //kernels/exl3:exl3_linear_benchmark
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "common/half.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/exl3/parallel.h"

namespace dsmesh {
namespace {

Exl3Weight RandomWeight(int64_t k, int64_t n, int K) {
  std::mt19937 rng(1);
  Exl3Weight w;
  w.K = K;
  w.codebook = Exl3Codebook::kMcg;
  w.in_features = k;
  w.out_features = n;
  w.trellis = AllocateTensor(DType::kI16, {k / 16, n / 16, 16 * K});
  for (int64_t i = 0; i < w.trellis.numel(); ++i) w.trellis.as<uint16_t>()[i] = static_cast<uint16_t>(rng());
  w.suh = AllocateTensor(DType::kF16, {k});
  w.svh = AllocateTensor(DType::kF16, {n});
  for (int64_t i = 0; i < k; ++i) w.suh.as<uint16_t>()[i] = FloatToFp16(rng() & 1 ? 0.01f : -0.01f);
  for (int64_t i = 0; i < n; ++i) w.svh.as<uint16_t>()[i] = FloatToFp16(rng() & 1 ? 1.0f : -1.0f);
  return w;
}

void BM_Exl3LinearCpu(benchmark::State& state) {
  const int K = static_cast<int>(state.range(0));
  const int64_t m = state.range(1), k = 4096, n = 2048;
  const Exl3Weight w = RandomWeight(k, n, K);
  std::vector<float> x(m * k, 0.5f), y(m * n);
  for (auto _ : state) {
    Exl3LinearCpu(w, x.data(), m, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  const double calls = static_cast<double>(state.iterations());
  state.counters["trellis_GB/s"] = benchmark::Counter(calls * w.trellis.nbytes() / 1e9, benchmark::Counter::kIsRate);
  state.counters["Gweights/s"] = benchmark::Counter(calls * k * n / 1e9, benchmark::Counter::kIsRate);
  state.counters["threads"] = Exl3ThreadCount();
  state.SetLabel("K=" + std::to_string(K) + " m=" + std::to_string(m) + " 4096x2048 mcg");
}

BENCHMARK(BM_Exl3LinearCpu)
    ->ArgNames({"K", "m"})
    ->ArgsProduct({{2, 3, 6}, {1, 4, 16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime()  // "CPU" = all threads; on a shared machine compare it with "Time"
    ->MinTime(0.3);

}  // namespace
}  // namespace dsmesh

BENCHMARK_MAIN();

// dsmesh-kernel-bench: times the EXL3 CUDA kernels on the anchor table's cases and prints, per case,
// the measured time (CUDA-graph replay, cold weights, median), the byte floor (weight bytes / measured
// copy bandwidth), the decode-op floor (integer ops per weight x weights / measured integer throughput),
// exllamav3's time on an H200 from anchors-h200.json, and the speed-up over it.
//
//   dsmesh-kernel-bench [--anchors FILE] [--only dense|moe|gemm|batch|hc] [--replays N]
//                       [--gemv-ctas-per-sm 2,4,...] [--moe-items-per-sm 3,6,...]   (k-split sweeps)
//                       [--filter 'K2 wq_b']   (only cases whose label contains the text)
//                       [--warm-weights]       (dense: one L2-resident weight copy; diagnostic)
//
// --anchors defaults to the repository's kernels/cuda/testdata/anchors-h200.json (common/repo_file.h).
//
// Weights are random valid trellises (MCG codebook, like the anchors), rotated over enough copies that
// the weights read by one graph replay exceed the L2 several times; MoE cases use 256 experts and a
// different random routing for every call in the graph.
//
// batch cases (not in the default run: --only batch) time V4-Flash's sets of EXL3 linears that a decode
// step runs together (the attention inputs of x, the two projections of q_a, the shared expert's w1/w3,
// wo_a's 8 groups; K6 as the reference deployment pack's dense linears) as separate GEMV launches and as one batched
// launch (Exl3GemvBatch), side by side, beside the set's byte floor.
//
// hc cases (not in the default run: --only hc) time the hyper-connection ops of a decode step at
// V4-Flash's shape (hc 4, D 4096; rows 1, 4, 16): HcPre in one launch (the model's), HcPre with y's norm
// in the same launch, and HcPost, each as 96 calls in one graph with PDL on the stream (as the backend's
// decode chain runs), fn rotated over 96 copies so that it comes from HBM as in a step.
//
// gemm cases (prefill, m = 32..512 on the anchor table's six dense shapes, K 2/3/6) print our time
// (decode + input transform, cuBLAS fp16, output transform), the decode launch alone, and cuBLAS bf16
// (cublasGemmEx, bf16 in/out, fp32 accumulate) on the same shape with its own cold weight copies; the
// rate is cuBLAS time / our time (the target: >= 50% at m = 512).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/program.h"
#include "common/repo_file.h"
#include "kernels/cuda/cuda_backend_options.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_presence.h"
#include "kernels/cuda/exl3_gemm.h"
#include "kernels/cuda/exl3_gemm_kernels.h"
#include "kernels/cuda/exl3_gemv.h"
#include "kernels/exl3/decode_cost.h"
#include "kernels/cuda/exl3_moe.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/pdl_streams.h"

namespace dsmesh::bench {
int FillRandom(void* p, int64_t words, uint32_t seed, cudaStream_t s);
int Lop3Chains(uint32_t* out, int blocks, int iters, cudaStream_t s);
int FillRandomBf16(void* p, int64_t count, uint32_t seed, cudaStream_t s);
int EmptyLaunch(int* sink, int blocks, cudaStream_t s);
}  // namespace dsmesh::bench

namespace dsmesh {
namespace {

std::string g_filter;  // --filter: only cases whose label contains this
// --warm-weights: the dense cases reuse one weight copy (L2-resident after the first call) instead of
// rotating over cold copies. A diagnostic, not comparable with the anchors: the difference to the cold
// run is the time spent waiting for weight bytes from HBM.
bool g_warm_weights = false;
// The workspaces' tuning: DSMESH_EXL3_GEMV_CTAS_PER_SM / DSMESH_EXL3_MOE_* (read once in Main), each
// value of a --gemv-ctas-per-sm / --moe-items-per-sm sweep in turn.
Exl3GemvTuning g_gemv_tuning;
Exl3MoeTuning g_moe_tuning;
Exl3MoeCounters g_moe_counts;  // summed over the MoE cases' workspaces

// Integer-pipe instructions per decoded weight: kernels/exl3/decode_cost.h.
double DecodeOpsPerWeight(int K, int rows) { return Exl3DecodeOpsPerWeight(K, rows); }

struct Event {
  cudaEvent_t e;
  Event() { CudaCheck(cudaEventCreate(&e), "event"); }
  ~Event() { cudaEventDestroy(e); }
};

template <class T>
T* DeviceAlloc(size_t count) {
  T* p = nullptr;
  CudaCheck(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)), "bench cudaMalloc");
  return p;
}

double MeasureCopyBandwidth(cudaStream_t s) {
  const size_t bytes = size_t(2) << 30;
  void* a = DeviceAlloc<uint8_t>(bytes);
  void* b = DeviceAlloc<uint8_t>(bytes);
  CudaCheck(cudaMemsetAsync(a, 1, bytes, s), "memset");
  Event t0, t1;
  CudaCheck(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "copy");
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) {
    CudaCheck(cudaEventRecord(t0.e, s), "rec");
    CudaCheck(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "copy");
    CudaCheck(cudaEventRecord(t1.e, s), "rec");
    CudaCheck(cudaEventSynchronize(t1.e), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, t0.e, t1.e);
    v.push_back(2.0 * bytes / (ms * 1e-3));  // read + write
  }
  cudaFree(a);
  cudaFree(b);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double MeasureIntThroughput(int sms, cudaStream_t s) {
  uint32_t* out = DeviceAlloc<uint32_t>(1);
  const int blocks = 8 * sms, iters = 8192;
  CudaCheck(static_cast<cudaError_t>(bench::Lop3Chains(out, blocks, iters, s)), "lop3 probe");
  Event t0, t1;
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) {
    CudaCheck(cudaEventRecord(t0.e, s), "rec");
    CudaCheck(static_cast<cudaError_t>(bench::Lop3Chains(out, blocks, iters, s)), "lop3 probe");
    CudaCheck(cudaEventRecord(t1.e, s), "rec");
    CudaCheck(cudaEventSynchronize(t1.e), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, t0.e, t1.e);
    v.push_back(double(blocks) * 256 * iters * 8 / (ms * 1e-3));
  }
  cudaFree(out);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<uint16_t> RandomHalves(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const __half h = __float2half(nd(rng));
    x = *reinterpret_cast<const uint16_t*>(&h);
  }
  return v;
}

uint16_t* UploadHalves(const std::vector<uint16_t>& h) {
  uint16_t* d = DeviceAlloc<uint16_t>(h.size());
  CudaCheck(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload");
  return d;
}

// Replays `exec` (holding `calls` calls) `replays` times; median microseconds per call.
double TimeGraph(cudaGraphExec_t exec, int calls, int replays, cudaStream_t s) {
  for (int i = 0; i < 2; ++i) CudaCheck(cudaGraphLaunch(exec, s), "warm-up replay");
  Event t0, t1;
  std::vector<double> v;
  for (int r = 0; r < replays; ++r) {
    CudaCheck(cudaEventRecord(t0.e, s), "rec");
    CudaCheck(cudaGraphLaunch(exec, s), "replay");
    CudaCheck(cudaEventRecord(t1.e, s), "rec");
    CudaCheck(cudaEventSynchronize(t1.e), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, t0.e, t1.e);
    v.push_back(ms * 1000.0 / calls);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Captures launch(0), ..., launch(calls - 1) on stream s into one CUDA graph and returns the median
// per-call time of its replays (TimeGraph).
template <class Launch>
double TimeCapturedCalls(int calls, int replays, cudaStream_t s, Launch&& launch) {
  cudaGraph_t graph;
  CudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int c = 0; c < calls; ++c) launch(c);
  CudaCheck(cudaStreamEndCapture(s, &graph), "end capture");
  cudaGraphExec_t exec;
  CudaCheck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const double us = TimeGraph(exec, calls, replays, s);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

// Per-node time of a graph of 20 empty kernels with `blocks` CTAs: the launch floor under every
// small case (a kernel cannot finish faster than its graph node).
double MeasureEmptyNode(int blocks, int replays, cudaStream_t s) {
  int* sink = DeviceAlloc<int>(blocks);
  const double us = TimeCapturedCalls(20, replays, s, [&](int) {
    CudaCheck(static_cast<cudaError_t>(bench::EmptyLaunch(sink, blocks, s)), "empty launch");
  });
  cudaFree(sink);
  return us;
}

// The MCG linear that call c of a graph uses when the graph rotates over `copies` trellis copies of
// `bytes` each (so that the weights are cold in L2).
Exl3DeviceLinear RotatedLinear(int64_t k, int64_t n, int K, const uint8_t* trellis, size_t bytes, int copies, int c,
                               const uint16_t* suh, const uint16_t* svh, const std::string& name) {
  Exl3DeviceLinear l;
  l.k = k;
  l.n = n;
  l.K = K;
  l.codebook = 1;
  l.trellis = reinterpret_cast<const uint16_t*>(trellis + bytes * (c % copies));
  l.suh = suh;
  l.svh = svh;
  l.name = name;
  return l;
}

struct Row {
  std::string kind, label;
  double us, byte_floor, op_floor, anchor_us;
};

void PrintRow(const Row& r) {
  std::printf("%-6s %-36s %9.2f %9.2f %9.2f %9.2f %7.2fx  %5.2fx-of-floor\n", r.kind.c_str(), r.label.c_str(), r.us,
              r.byte_floor, r.op_floor, r.anchor_us, r.anchor_us / r.us, r.us / std::max(r.byte_floor, r.op_floor));
  std::fflush(stdout);
}

void PrintHeader() {
  std::printf("%-6s %-36s %9s %9s %9s %9s %8s\n", "kind", "case", "us", "byte_fl", "op_fl", "exl3_us", "speedup");
}

void Summary(const std::string& kind, const std::vector<Row>& rows) {
  if (rows.empty()) return;
  double lg = 0, mn = 1e30, mx = 0;
  for (const auto& r : rows) {
    const double s = r.anchor_us / r.us;
    lg += std::log(s);
    mn = std::min(mn, s);
    mx = std::max(mx, s);
  }
  std::printf("SUMMARY %s: %zu cases, geomean speedup %.2fx, min %.2fx, max %.2fx\n", kind.c_str(), rows.size(),
              std::exp(lg / rows.size()), mn, mx);
}

void RunDense(const nlohmann::json& anchors, double bw, double intops, int replays, cudaStream_t s,
              std::vector<Row>& rows) {
  Exl3GemvWorkspace ws(64u << 20, g_gemv_tuning);
  std::mt19937 rng(1);
  if (g_warm_weights) std::printf("dense weights: one L2-resident copy per case (--warm-weights), not comparable with the anchors\n");
  for (const auto& a : anchors["results"]) {
    if (a["kind"] != "gemm") continue;
    const int K = a["K"], m = a["m"];
    const std::string shape = a["shape"];
    const size_t sp = shape.find(' '), xp = shape.find('x', sp);
    const int64_t k = std::stoll(shape.substr(sp + 1, xp - sp - 1)), n = std::stoll(shape.substr(xp + 1));
    const std::string dense_label = "K" + std::to_string(K) + " " + shape + " m" + std::to_string(m);
    if (!g_filter.empty() && dense_label.find(g_filter) == std::string::npos) continue;
    const size_t bytes = size_t(k) * n * K / 8;
    const int copies =
        g_warm_weights ? 1 : static_cast<int>(std::clamp<size_t>((size_t(256) << 20) / bytes + 1, 2, 512));
    uint8_t* tr = DeviceAlloc<uint8_t>(bytes * copies);
    CudaCheck(static_cast<cudaError_t>(bench::FillRandom(tr, int64_t(bytes * copies / 4), 1234 + K, s)), "fill");
    std::vector<uint16_t> ones_k(k, 0x3C00), ones_n(n, 0x3C00);
    uint16_t* suh = UploadHalves(ones_k);
    uint16_t* svh = UploadHalves(ones_n);
    uint16_t* x = UploadHalves(RandomHalves(size_t(m) * k, rng, 1.0f));
    uint16_t* y = DeviceAlloc<uint16_t>(size_t(m) * n);
    CudaCheck(cudaStreamSynchronize(s), "sync");
    const int calls = std::max(20, copies);
    Row r;
    r.us = TimeCapturedCalls(calls, replays, s, [&](int c) {
      Exl3Gemv(RotatedLinear(k, n, K, tr, bytes, copies, c, suh, svh, shape), x, m, y, Exl3Out::kF16, ws, s);
    });
    r.kind = "dense";
    r.label = dense_label;
    r.byte_floor = bytes / bw * 1e6;
    r.op_floor = DecodeOpsPerWeight(K, m) * double(k) * n / intops * 1e6;
    r.anchor_us = a["us"];
    rows.push_back(r);
    PrintRow(r);
    cudaFree(tr);
    cudaFree(suh);
    cudaFree(svh);
    cudaFree(x);
    cudaFree(y);
  }
}

// V4-Flash's linears that share a batched launch in a decode step: (k, n of each job).
struct BatchSet {
  const char* label;
  int64_t k;
  std::vector<int64_t> n;
};
const BatchSet kBatchSets[] = {
    {"x: wq_a wkv cmp.wkv cmp.wgate idx.wkv idx.wgate", 4096, {1024, 512, 1024, 1024, 256, 256}},
    {"q_a: wq_b idx.wq_b", 1024, {32768, 8192}},
    {"shared expert w1 w3", 4096, {2048, 2048}},
    {"wo_a 8 groups", 4096, {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}},
};

void RunBatch(double bw, int replays, cudaStream_t s) {
  constexpr int K = 6;
  Exl3GemvWorkspace ws(256u << 20, g_gemv_tuning);
  std::mt19937 rng(2);
  std::printf("%-6s %-48s %4s %11s %11s %8s %9s\n", "kind", "set (K6)", "m", "separate_us", "batched_us", "ratio",
              "byte_fl");
  for (const BatchSet& set : kBatchSets) {
    for (int m : {1, 4, 16}) {
      const std::string label = std::string(set.label) + " m" + std::to_string(m);
      if (!g_filter.empty() && label.find(g_filter) == std::string::npos) continue;
      const int jobs = static_cast<int>(set.n.size());
      size_t bytes = 0;  // one copy of the set's weights
      int64_t n_max = 0;
      for (int64_t n : set.n) {
        bytes += size_t(set.k) * n * K / 8;
        n_max = std::max(n_max, n);
      }
      const int copies = static_cast<int>(std::clamp<size_t>((size_t(256) << 20) / bytes + 1, 2, 512));
      uint8_t* tr = DeviceAlloc<uint8_t>(bytes * copies);
      CudaCheck(static_cast<cudaError_t>(bench::FillRandom(tr, int64_t(bytes * copies / 4), 4321, s)), "fill");
      uint16_t* suh = UploadHalves(std::vector<uint16_t>(set.k, 0x3C00));
      uint16_t* svh = UploadHalves(std::vector<uint16_t>(n_max, 0x3C00));
      uint16_t* x = UploadHalves(RandomHalves(size_t(m) * set.k, rng, 1.0f));
      std::vector<uint16_t*> y(jobs);
      for (int j = 0; j < jobs; ++j) y[j] = DeviceAlloc<uint16_t>(size_t(m) * set.n[j]);
      CudaCheck(cudaStreamSynchronize(s), "sync");
      // Call c uses copy c % copies of every job's weights (cold in L2), jobs laid out one after another.
      const auto linears = [&](int c) {
        std::vector<Exl3DeviceLinear> l(jobs);
        size_t offset = bytes * (c % copies);
        for (int j = 0; j < jobs; ++j) {
          l[j] = RotatedLinear(set.k, set.n[j], K, tr + offset, 0, 1, 0, suh, svh, "batch job " + std::to_string(j));
          offset += size_t(set.k) * set.n[j] * K / 8;
        }
        return l;
      };
      const int calls = std::max(20, copies);
      const double separate = TimeCapturedCalls(calls, replays, s, [&](int c) {
        const std::vector<Exl3DeviceLinear> l = linears(c);
        for (int j = 0; j < jobs; ++j) Exl3Gemv(l[j], x, m, y[j], Exl3Out::kF16, ws, s);
      });
      const double batched = TimeCapturedCalls(calls, replays, s, [&](int c) {
        const std::vector<Exl3DeviceLinear> l = linears(c);
        std::vector<Exl3GemvJob> b(jobs);
        for (int j = 0; j < jobs; ++j) b[j] = {&l[j], x, y[j]};
        Exl3GemvBatch(b.data(), jobs, m, Exl3Out::kF16, ws, s);
      });
      std::printf("%-6s %-48s %4d %11.2f %11.2f %7.2fx %9.2f\n", "batch", set.label, m, separate, batched,
                  separate / batched, bytes / bw * 1e6);
      std::fflush(stdout);
      cudaFree(tr);
      cudaFree(suh);
      cudaFree(svh);
      cudaFree(x);
      for (uint16_t* p : y) cudaFree(p);
    }
  }
}

std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

float* UploadFloats(const std::vector<float>& h) {
  float* d = DeviceAlloc<float>(h.size());
  CudaCheck(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "upload");
  return d;
}

// The hyper-connection ops at V4-Flash's decode shape (the header's "hc cases").
void RunHc(int replays, cudaStream_t s) {
  constexpr int hc = 4, iters = 20, copies = 96;
  constexpr int64_t D = 4096, K = (2 + hc) * hc, fn_floats = K * hc * D;
  constexpr float eps = 1e-6f, norm_eps = 1e-6f;
  std::mt19937 rng(5);
  float* fn = UploadFloats(RandomFloats(fn_floats, rng, 0.05f));
  float* fns = DeviceAlloc<float>(fn_floats * copies);
  for (int c = 0; c < copies; ++c)
    CudaCheck(cudaMemcpy(fns + fn_floats * c, fn, fn_floats * 4, cudaMemcpyDeviceToDevice), "fn copies");
  float* base = UploadFloats(RandomFloats(K, rng, 0.5f));
  float* scale = UploadFloats(RandomFloats(3, rng, 1.0f));
  std::atomic<int64_t> pdl_launches{0};
  EnablePdlOnStream(s, &pdl_launches);
  std::printf("%-6s %-44s %5s %9s\n", "kind", "op (hc 4, D 4096, fn cold)", "rows", "us");
  for (int64_t n : {1, 4, 16}) {
    float* X = UploadFloats(RandomFloats(n * hc * D, rng, 1.0f));
    float* f = UploadFloats(RandomFloats(n * D, rng, 1.0f));
    float* y = DeviceAlloc<float>(n * D);
    float* post = DeviceAlloc<float>(n * hc);
    float* comb = DeviceAlloc<float>(n * hc * hc);
    float* out = DeviceAlloc<float>(n * hc * D);
    const double pre_us = TimeCapturedCalls(copies, replays, s, [&](int c) {
      cuda_ops::HcPre(X, n, D, hc, fns + fn_floats * (c % copies), base, scale, iters, eps, norm_eps, y, post, comb, s);
    });
    // What a block's attention / FFN input costs: HcPre with the norm of y in its launch.
    const cuda_ops::HcYNorm norm{f, 1e-6f};  // f's first row as the norm weight
    const double pre_norm_us = TimeCapturedCalls(copies, replays, s, [&](int c) {
      cuda_ops::HcPre(X, n, D, hc, fns + fn_floats * (c % copies), base, scale, iters, eps, norm_eps, y, post, comb, s,
                      &norm);
    });
    const double post_us = TimeCapturedCalls(copies, replays, s, [&](int) {
      cuda_ops::HcPost(X, f, post, comb, n, D, hc, out, s);
    });
    CudaCheck(cudaStreamSynchronize(s), "hc sync");
    CudaCheck(cudaGetLastError(), "hc launches");
    std::printf("%-6s %-44s %5lld %9.2f\n", "hc", "HcPre (one launch, cluster of 8 per role)", (long long)n, pre_us);
    std::printf("%-6s %-44s %5lld %9.2f\n", "hc", "HcPre + y RmsNorm (one launch)", (long long)n, pre_norm_us);
    std::printf("%-6s %-44s %5lld %9.2f\n", "hc", "HcPost", (long long)n, post_us);
    std::fflush(stdout);
    for (float* p : {X, f, y, post, comb, out}) cudaFree(p);
  }
  DisablePdlOnStream(s);
  for (float* p : {fn, fns, base, scale}) cudaFree(p);
}

void RunMoe(const nlohmann::json& anchors, double bw, double intops, int replays, cudaStream_t s,
            std::vector<Row>& rows) {
  const int E = 256, topk = 6, d = 4096, calls = 20;
  std::map<std::pair<int, int>, std::vector<nlohmann::json>> groups;
  for (const auto& a : anchors["results"])
    if (a["kind"] == "moe") groups[{a["K"].get<int>(), a["I"].get<int>()}].push_back(a);
  std::mt19937 rng(2);
  for (const auto& [key, cases] : groups) {
    const int K = key.first, I = key.second;
    const size_t proj_bytes = size_t(d) * I * K / 8;
    uint8_t* tr[3];
    for (int p = 0; p < 3; ++p) {
      tr[p] = DeviceAlloc<uint8_t>(proj_bytes * E);
      CudaCheck(static_cast<cudaError_t>(bench::FillRandom(tr[p], int64_t(proj_bytes * E / 4), 77 + p * 13 + K, s)), "fill");
    }
    std::vector<uint16_t> ones_d(d, 0x3C00), ones_i(I, 0x3C00);
    uint16_t* sd = UploadHalves(ones_d);
    uint16_t* si = UploadHalves(ones_i);
    std::vector<const uint16_t*> tabs[9];
    for (int e = 0; e < E; ++e) {
      for (int p = 0; p < 3; ++p) {
        tabs[p * 3 + 0].push_back(reinterpret_cast<const uint16_t*>(tr[p] + proj_bytes * e));
        tabs[p * 3 + 1].push_back(p == 2 ? si : sd);  // suh: [k]
        tabs[p * 3 + 2].push_back(p == 2 ? sd : si);  // svh: [n]
      }
    }
    const uint16_t** dtabs[9];
    for (int t = 0; t < 9; ++t) {
      dtabs[t] = DeviceAlloc<const uint16_t*>(E);
      CudaCheck(cudaMemcpy(dtabs[t], tabs[t].data(), E * sizeof(void*), cudaMemcpyHostToDevice), "tables");
    }
    Exl3MoeLayer layer;
    layer.name = "bench.experts";
    layer.num_experts = E;
    layer.hidden = d;
    layer.inter = I;
    layer.K = K;
    layer.codebook = 1;
    layer.swiglu_limit = 10.0f;
    layer.SetTables(dtabs);
    Exl3MoeWorkspace ws(24, topk, d, I, g_moe_tuning);
    for (const auto& a : cases) {
      const int m = a["m"];
      const std::string moe_key = "K" + std::to_string(K) + " I" + std::to_string(I) + " m" + std::to_string(m);
      if (!g_filter.empty() && moe_key.find(g_filter) == std::string::npos) continue;
      uint16_t* x = UploadHalves(RandomHalves(size_t(m) * d, rng, 0.05f));
      float* y = DeviceAlloc<float>(size_t(m) * d);
      std::vector<int32_t*> ids(calls);
      std::vector<float*> wts(calls);
      double unique_sum = 0;
      for (int c = 0; c < calls; ++c) {
        std::vector<int32_t> hid;
        std::vector<float> hw;
        std::set<int> uniq;
        for (int r = 0; r < m; ++r) {
          std::vector<int> all(E);
          for (int e = 0; e < E; ++e) all[e] = e;
          std::shuffle(all.begin(), all.end(), rng);
          for (int k = 0; k < topk; ++k) {
            hid.push_back(all[k]);
            hw.push_back(1.0f / topk);
            uniq.insert(all[k]);
          }
        }
        unique_sum += uniq.size();
        ids[c] = DeviceAlloc<int32_t>(hid.size());
        wts[c] = DeviceAlloc<float>(hw.size());
        CudaCheck(cudaMemcpy(ids[c], hid.data(), hid.size() * 4, cudaMemcpyHostToDevice), "ids");
        CudaCheck(cudaMemcpy(wts[c], hw.data(), hw.size() * 4, cudaMemcpyHostToDevice), "weights");
      }
      const double unique = unique_sum / calls;
      Row r;
      r.us = TimeCapturedCalls(calls, replays, s,
                               [&](int c) { Exl3MoeForward(layer, x, ids[c], wts[c], m, y, ws, s); });
      r.kind = "moe";
      char label[96];
      std::snprintf(label, sizeof label, "K%d I%d m%d (unique %.1f vs %d)", K, I, m, unique, a["unique"].get<int>());
      r.label = label;
      r.byte_floor = unique * 3 * proj_bytes / bw * 1e6;
      // An expert sees about m * topk / unique <= 8 rows here: the few-rows loop.
      r.op_floor = DecodeOpsPerWeight(K, 1) * unique * 3.0 * d * I / intops * 1e6;
      r.anchor_us = a["us"];
      rows.push_back(r);
      PrintRow(r);
      for (int c = 0; c < calls; ++c) {
        cudaFree(ids[c]);
        cudaFree(wts[c]);
      }
      cudaFree(x);
      cudaFree(y);
    }
    g_moe_counts.launches += ws.counts().launches;
    g_moe_counts.rows += ws.counts().rows;
    g_moe_counts.rejected += ws.counts().rejected;
    for (int p = 0; p < 3; ++p) cudaFree(tr[p]);
    for (int t = 0; t < 9; ++t) cudaFree(dtabs[t]);
    cudaFree(sd);
    cudaFree(si);
  }
}


void CublasOk(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS error " + cublasGetStatusName(st));
}

struct GemmRow {
  std::string label;
  double us, decode_us, recon_us, cublas_us;
  double flops;
};

// Prefill GEMM vs cuBLAS bf16 on the anchor table's dense shapes.
void RunGemm(const nlohmann::json& anchors, int replays, cudaStream_t s, std::vector<GemmRow>& rows) {
  std::vector<std::string> shapes;
  for (const auto& a : anchors["results"])
    if (a["kind"] == "gemm" && std::find(shapes.begin(), shapes.end(), a["shape"]) == shapes.end()) shapes.push_back(a["shape"]);
  const int kMs[] = {32, 64, 128, 256, 512};
  Exl3GemmWorkspace ws(512, 8192, 32768, int64_t(32) << 20);
  cublasHandle_t h;
  CublasOk(cublasCreate(&h), "cublasCreate");
  void* cws = DeviceAlloc<uint8_t>(size_t(32) << 20);
  CublasOk(cublasSetStream(h, s), "cublasSetStream");
  CublasOk(cublasSetWorkspace(h, cws, size_t(32) << 20), "cublasSetWorkspace");
  std::mt19937 rng(3);
  // decode = the GEMM's weight launch alone (W_eff = Ŵ Hn diag(svh), no input transform); recon = the
  // plain Ŵ decode (Exl3Reconstruct) for comparison.
  std::printf("%-6s %-36s %9s %9s %9s %9s %8s %9s %9s\n", "kind", "case", "us", "decode", "recon", "cublas", "rate",
              "TFLOP/s", "cuBLAS_TF");
  for (const std::string& shape : shapes) {
    const size_t sp = shape.find(' '), xp = shape.find('x', sp);
    const int64_t k = std::stoll(shape.substr(sp + 1, xp - sp - 1)), n = std::stoll(shape.substr(xp + 1));
    // cuBLAS bf16 baseline, once per (shape, m): cold weight copies like ours.
    const size_t wbytes = size_t(k) * n * 2;
    const int wcopies = static_cast<int>(std::clamp<size_t>((size_t(256) << 20) / wbytes + 1, 2, 128));
    uint16_t* wb = DeviceAlloc<uint16_t>(size_t(k) * n * wcopies);
    uint16_t* xb = DeviceAlloc<uint16_t>(size_t(512) * k);
    uint16_t* yb = DeviceAlloc<uint16_t>(size_t(512) * n);
    CudaCheck(static_cast<cudaError_t>(bench::FillRandomBf16(wb, int64_t(k) * n * wcopies, 99, s)), "fill bf16");
    CudaCheck(static_cast<cudaError_t>(bench::FillRandomBf16(xb, int64_t(512) * k, 98, s)), "fill bf16");
    std::map<int, double> cublas_us;
    for (int m : kMs) {
      const int calls = std::max(20, wcopies);
      const float alpha = 1.f, beta = 0.f;
      cublas_us[m] = TimeCapturedCalls(calls, replays, s, [&](int c) {
        CublasOk(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), m, int(k), &alpha, wb + size_t(k) * n * (c % wcopies),
                              CUDA_R_16BF, int(n), xb, CUDA_R_16BF, int(k), &beta, yb, CUDA_R_16BF, int(n),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx bf16");
      });
    }
    cudaFree(wb);
    cudaFree(xb);
    cudaFree(yb);
    for (int K : {2, 3, 6}) {
      const size_t bytes = size_t(k) * n * K / 8;
      const int copies = static_cast<int>(std::clamp<size_t>((size_t(256) << 20) / bytes + 1, 2, 512));
      uint8_t* tr = DeviceAlloc<uint8_t>(bytes * copies);
      CudaCheck(static_cast<cudaError_t>(bench::FillRandom(tr, int64_t(bytes * copies / 4), 4321 + K, s)), "fill");
      std::vector<uint16_t> ones_k(k, 0x3C00), ones_n(n, 0x3C00);
      uint16_t* suh = UploadHalves(ones_k);
      uint16_t* svh = UploadHalves(ones_n);
      uint16_t* x = UploadHalves(RandomHalves(size_t(512) * k, rng, 1.0f));
      uint16_t* y = DeviceAlloc<uint16_t>(size_t(512) * n);
      uint16_t* what = DeviceAlloc<uint16_t>(size_t(k) * n);
      CudaCheck(cudaStreamSynchronize(s), "sync");
      const int calls = std::max(20, copies);
      auto linear = [&](int c) { return RotatedLinear(k, n, K, tr, bytes, copies, c, suh, svh, shape); };
      // The weight launch alone (no input transform) and the plain Ŵ decode, for the breakdown.
      auto time_calls = [&](auto&& launch) { return TimeCapturedCalls(calls, replays, s, launch); };
      const double decode_us = time_calls([&](int c) {
        exl3cuda::GemmWeightParams p{};
        p.trellis = linear(c).trellis;
        p.svh = svh;
        p.weff = what;
        p.k = static_cast<int>(k);
        p.n = static_cast<int>(n);
        p.one = 1;
        CudaCheck(static_cast<cudaError_t>(exl3cuda::LaunchGemmWeight(K, 1, p, s)), "W_eff launch");
      });
      const double recon_us = time_calls([&](int c) { Exl3Reconstruct(linear(c), what, s); });
      for (int m : kMs) {
        const std::string label = "K" + std::to_string(K) + " " + shape + " m" + std::to_string(m);
        if (!g_filter.empty() && label.find(g_filter) == std::string::npos) continue;
        GemmRow r;
        r.label = label;
        r.us = time_calls([&](int c) { Exl3Gemm(linear(c), x, m, y, Exl3Out::kF16, ws, s); });
        r.decode_us = decode_us;
        r.recon_us = recon_us;
        r.cublas_us = cublas_us[m];
        r.flops = 2.0 * m * k * n;
        rows.push_back(r);
        std::printf("%-6s %-36s %9.2f %9.2f %9.2f %9.2f %7.0f%% %9.1f %9.1f\n", "gemm", r.label.c_str(), r.us, r.decode_us,
                    r.recon_us, r.cublas_us, 100.0 * r.cublas_us / r.us, r.flops / r.us * 1e-6, r.flops / r.cublas_us * 1e-6);
        std::fflush(stdout);
      }
      cudaFree(tr);
      cudaFree(suh);
      cudaFree(svh);
      cudaFree(x);
      cudaFree(y);
      cudaFree(what);
    }
  }
  cublasDestroy(h);
  cudaFree(cws);
}

// run(rows) once with the knob `var` as the environment has it, or, for a sweep, once per value of
// `var` (set(value) puts it in the tuning the workspaces are made with) with one summary each; `rows` gets
// the first value's rows.
template <class Set, class Run>
void RunSweep(const std::string& kind, const char* var, const std::vector<int32_t>& values, std::vector<Row>& rows,
              Set&& set, Run&& run) {
  if (values.empty()) return run(rows);
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string v = std::to_string(values[i]);
    set(values[i]);
    std::printf("-- %s=%s\n", var, v.c_str());
    std::vector<Row> swept;
    run(swept);
    Summary(kind + "(" + var + "=" + v + ")", swept);
    if (i == 0) rows = swept;
  }
}

void GemmSummary(const std::vector<GemmRow>& rows) {
  for (int m : {32, 64, 128, 256, 512}) {
    double lg = 0, mn = 1e30;
    int count = 0;
    for (const auto& r : rows) {
      if (r.label.size() < 4 || r.label.substr(r.label.rfind(" m") + 2) != std::to_string(m)) continue;
      const double rate = r.cublas_us / r.us;
      lg += std::log(rate);
      mn = std::min(mn, rate);
      ++count;
    }
    if (count)
      std::printf("SUMMARY gemm m=%d: %d cases, rate vs cuBLAS bf16 geomean %.0f%%, min %.0f%% (target >= 50%% at m=512)\n",
                  m, count, 100.0 * std::exp(lg / count), 100.0 * mn);
  }
}

int Main(int argc, char** argv) {
  std::string anchors_path, only;
  int replays = 15;
  std::vector<int32_t> ctas_per_sm, items_per_sm;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("flag " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--anchors") anchors_path = value();
    else if (a == "--only") only = value();
    else if (a == "--replays") {
      const std::string v = value();
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), replays);
      if (ec != std::errc() || end != v.data() + v.size() || replays < 1)
        throw UsageError("--replays: \"" + v + "\" is not a count of at least 1");
    }
    else if (a == "--filter") g_filter = value();
    else if (a == "--warm-weights") g_warm_weights = true;
    else if (a == "--moe-items-per-sm") items_per_sm = ParseIntList(a.substr(2), value(), "integer item count");
    else if (a == "--gemv-ctas-per-sm") ctas_per_sm = ParseIntList(a.substr(2), value(), "integer CTA count");
    else throw UsageError("unknown flag " + a + " (usage: [--anchors FILE] [--only dense|moe|gemm|batch|hc] [--replays N] [--gemv-ctas-per-sm LIST] [--moe-items-per-sm LIST] [--filter TEXT] [--warm-weights])");
  }
  if (!only.empty() && only != "dense" && only != "moe" && only != "gemm" && only != "batch" && only != "hc")
    throw UsageError("--only: \"" + only + "\" is not one of dense, moe, gemm, batch, hc");
  g_gemv_tuning = Exl3GemvTuningFromEnvironment();
  g_moe_tuning = Exl3MoeTuningFromEnvironment();
  RequireCudaDevice(0, "the benchmark");
  if (anchors_path.empty()) anchors_path = RepoFile("kernels/cuda/testdata/anchors-h200.json");
  std::ifstream in(anchors_path);
  if (!in) throw std::runtime_error("cannot open anchors file " + anchors_path);
  nlohmann::json anchors;
  try {
    in >> anchors;
  } catch (const std::exception& e) {
    throw std::runtime_error(anchors_path + ": not valid JSON: " + e.what());
  }
  if (!anchors.contains("results")) throw std::runtime_error(anchors_path + ": no \"results\" array");

  cudaDeviceProp prop;
  CudaCheck(cudaGetDeviceProperties(&prop, 0), "device properties");
  cudaStream_t s;
  CudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const double bw = MeasureCopyBandwidth(s);
  const double intops = MeasureIntThroughput(prop.multiProcessorCount, s);
  std::printf("device %s, %d SMs, L2 %d MB; copy bandwidth %.0f GB/s (read+write); LOP3 throughput %.2f Tops/s\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, bw / 1e9, intops / 1e12);
  std::printf("graph node floor: empty kernel of %d x 256 threads %.2f us per node (20 nodes per graph)\n",
              2 * prop.multiProcessorCount, MeasureEmptyNode(2 * prop.multiProcessorCount, replays, s));
  std::printf("floors: byte = weight bytes / copy bandwidth; op = decode ops/weight (SASS count) x weights / LOP3 rate\n");
  PrintHeader();
  std::vector<Row> dense, moe;
  std::vector<GemmRow> gemm;
  if (only.empty() || only == "dense")
    RunSweep("dense", "DSMESH_EXL3_GEMV_CTAS_PER_SM", ctas_per_sm, dense,
             [](int v) { g_gemv_tuning.ctas_per_sm = v; },
             [&](std::vector<Row>& rows) { RunDense(anchors, bw, intops, replays, s, rows); });
  if (only.empty() || only == "moe")
    RunSweep("moe", "DSMESH_EXL3_MOE_ITEMS_PER_SM", items_per_sm, moe,
             [](int v) { g_moe_tuning.items_per_sm = v; },
             [&](std::vector<Row>& rows) { RunMoe(anchors, bw, intops, replays, s, rows); });
  if (only.empty() || only == "gemm") RunGemm(anchors, replays, s, gemm);
  if (only == "batch") RunBatch(bw, replays, s);
  if (only == "hc") RunHc(replays, s);
  Summary("dense", dense);
  Summary("moe", moe);
  GemmSummary(gemm);
  const Exl3MoeCounters& c = g_moe_counts;
  std::printf("routed-expert kernel counters: launches %lld, rows %lld, rejected %lld\n", (long long)c.launches,
              (long long)c.rows, (long long)c.rejected);
  return 0;
}

}  // namespace
}  // namespace dsmesh

int main(int argc, char** argv) {
  return dsmesh::RunProgram("dsmesh-kernel-bench", nullptr, [&] { return dsmesh::Main(argc, argv); });
}

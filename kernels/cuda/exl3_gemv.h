// Dense EXL3 linear on the GPU for decode-sized inputs: y[m, n] = x[m, k] W with m = 1..16, any K 1..8,
// any of the three codebooks, both Hadamard transforms fused into one launch (docs/exl3-format.md §3.2).
//
//   Exl3GemvWorkspace ws;                       // once per stream, before any CUDA-graph capture
//   Exl3Gemv(linear, x_fp16, m, y, Exl3Out::kF32, ws, stream);
//
// The launch allocates nothing, synchronizes nothing and tunes nothing, so it may be captured into a
// CUDA graph. Results are bitwise reproducible (no float atomics; split-K partials are summed in a
// fixed order). CPU reference: kernels/exl3/exl3_linear.h (Exl3LinearCpu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsmesh {

// A quantized linear whose tensors already live in device memory (owned by the caller).
struct Exl3DeviceLinear {
  int64_t k = 0, n = 0;               // padded sizes, multiples of 128
  int K = 0;                          // bits per weight, 1..8
  int codebook = 0;                   // 0 = 3INST, 1 = MCG, 2 = MUL1 (the order of Exl3Codebook)
  const uint16_t* trellis = nullptr;  // int16 [k/16, n/16, 16K], 16-byte aligned
  const uint16_t* suh = nullptr;      // fp16 [k]
  const uint16_t* svh = nullptr;      // fp16 [n]
  std::string name;                   // for error messages
};

enum class Exl3Out { kF32, kF16 };

// CTAs per SM the k-split aims for by default: three fit, two measured best (1.65x vs 1.55x
// geomean on the H200, docs/cuda-kernels.md).
constexpr int kExl3GemvCtasPerSm = 2;

struct Exl3GemvJob;

// Split-K scratch (partial sums and per-strip arrival counters). One per stream: a workspace is bound
// to the first stream it is used on, and using it on another stream throws (two launches sharing the
// counters at the same time would corrupt each other).
// Tuning of the GEMV launches a workspace serves (an A/B and sweep knob: the CLI and dsmesh-kernel-bench
// read it from DSMESH_EXL3_GEMV_CTAS_PER_SM, Exl3GemvTuningFromEnvironment in cuda_backend_options.h).
struct Exl3GemvTuning {
  int ctas_per_sm = kExl3GemvCtasPerSm;  // CTAs per SM the k-split aims for, 1..16
};

class Exl3GemvWorkspace {
 public:
  // Allocates on the current device; `partial_bytes` bounds splits * m * n * 4. Throws on a tuning out of
  // range.
  explicit Exl3GemvWorkspace(size_t partial_bytes = 16u << 20, const Exl3GemvTuning& tuning = {});
  ~Exl3GemvWorkspace();
  Exl3GemvWorkspace(const Exl3GemvWorkspace&) = delete;
  Exl3GemvWorkspace& operator=(const Exl3GemvWorkspace&) = delete;

  int device() const { return device_; }
  int ctas_per_sm() const { return ctas_per_sm_; }
  int num_sms() const { return num_sms_; }

 private:
  friend void Exl3GemvBatch(const Exl3GemvJob*, int, int, Exl3Out, Exl3GemvWorkspace&, cudaStream_t);
  float* partial_ = nullptr;
  size_t partial_bytes_ = 0;
  int* counters_ = nullptr;
  int num_counters_ = 0;
  int device_ = 0, num_sms_ = 0, ctas_per_sm_ = kExl3GemvCtasPerSm;
  bool bound_ = false;
  cudaStream_t stream_ = nullptr;
};

// Largest m the GEMV handles.
constexpr int kExl3GemvMaxRows = 16;

// How the launch is cut: number of k-splits for (k, n) and m rows on `num_sms` multiprocessors, aiming
// at ctas_per_sm CTAs per multiprocessor (half as many for m > 8 or when the full target would give
// more than 8 splits; the reasons are at the definition).
int Exl3GemvSplits(int64_t k, int64_t n, int m, int num_sms, int ctas_per_sm = kExl3GemvCtasPerSm);

// Throws std::runtime_error starting with `who` unless K is 1..8, the codebook is one of the three and
// k, n are positive multiples of 128 (what every kernel here requires of a linear).
void CheckExl3LinearShape(const Exl3DeviceLinear& w, const std::string& who);
// The same for a call's pointers: none null, trellis and y 16-byte aligned, x/suh/svh 8, and the
// current device the workspace's.
void CheckExl3LinearCall(const Exl3DeviceLinear& w, const void* x, const void* y, int workspace_device,
                         const std::string& who);

// y[m, n] (fp32 or fp16, row-major) = x[m, k] (fp16 bit patterns, row-major) W. Throws
// std::runtime_error naming the linear on bad shapes, pointers, alignment or a launch error.
void Exl3Gemv(const Exl3DeviceLinear& w, const uint16_t* x, int m, void* y, Exl3Out out, Exl3GemvWorkspace& ws,
              cudaStream_t stream);

// One linear of a batched launch: y[m, w.n] = x[m, w.k] W, or with `accumulate` (fp32 output only)
// y[m, w.n] += x[m, w.k] W.
struct Exl3GemvJob {
  const Exl3DeviceLinear* w = nullptr;
  const uint16_t* x = nullptr;
  void* y = nullptr;
  bool accumulate = false;
};

// Most linears one batched launch takes.
constexpr int kExl3GemvMaxBatch = 8;

// Whether two linears can share a batched launch: same K, codebook and k (n may differ).
bool Exl3GemvBatchable(const Exl3DeviceLinear& a, const Exl3DeviceLinear& b);

// Exl3Gemv for `count` (1..kExl3GemvMaxBatch) linears of one K, codebook and k, m rows each, in one launch:
// a layer's projections of the same input or the groups of a grouped projection pay one launch and one
// split-K finish latency instead of one each. The k-split is chosen for all their strips together, so a
// job's sums may be cut differently than in its own launch (fp32 rounding, same bound). Throws like
// Exl3Gemv, and when the linears are not batchable.
void Exl3GemvBatch(const Exl3GemvJob* jobs, int count, int m, Exl3Out out, Exl3GemvWorkspace& ws,
                   cudaStream_t stream);

// Ŵ, the rotated-basis weight (fp16 bit patterns, [k, n] row-major, device memory), bit-exact with
// exllamav3's `reconstruct`. Uses the GEMV's own per-lane tile decode.
void Exl3Reconstruct(const Exl3DeviceLinear& w, uint16_t* what, cudaStream_t stream);

}  // namespace dsmesh

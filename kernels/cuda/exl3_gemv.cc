#include "kernels/cuda/exl3_gemv.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/exl3_gemv_params.h"

namespace dsmesh {
namespace {

void PrepareKernelsOnce() {
  // Raising the dynamic shared-memory limit is a per-function attribute, set once per process and
  // device before any launch (never inside a capture).
  static PerDeviceOnce once;
  once.Run([](int) {
    CudaCheck(static_cast<cudaError_t>(exl3cuda::PrepareGemv3Inst()), "EXL3 GEMV (3inst) setup");
    CudaCheck(static_cast<cudaError_t>(exl3cuda::PrepareGemvMcg()), "EXL3 GEMV (mcg) setup");
    CudaCheck(static_cast<cudaError_t>(exl3cuda::PrepareGemvMul1()), "EXL3 GEMV (mul1) setup");
  });
}

bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

Exl3GemvWorkspace::Exl3GemvWorkspace(size_t partial_bytes, const Exl3GemvTuning& tuning)
    : partial_bytes_(partial_bytes) {
  if (tuning.ctas_per_sm < 1 || tuning.ctas_per_sm > 16)
    throw std::runtime_error("Exl3GemvWorkspace: ctas_per_sm " + std::to_string(tuning.ctas_per_sm) +
                             " (must be 1..16)");
  CudaCheck(cudaGetDevice(&device_), "cudaGetDevice");
  CudaCheck(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_), "SM count");
  PrepareKernelsOnce();
  ctas_per_sm_ = tuning.ctas_per_sm;
  num_counters_ = 1 << 14;
  CudaCheck(cudaMalloc(&partial_, partial_bytes_), "Exl3GemvWorkspace partial buffer");
  CudaCheck(cudaMalloc(&counters_, num_counters_ * sizeof(int)), "Exl3GemvWorkspace counters");
  CudaCheck(cudaMemset(counters_, 0, num_counters_ * sizeof(int)), "Exl3GemvWorkspace counters");
  CudaCheck(cudaDeviceSynchronize(), "Exl3GemvWorkspace init");
}

Exl3GemvWorkspace::~Exl3GemvWorkspace() {
  cudaFree(partial_);
  cudaFree(counters_);
}

int Exl3GemvSplits(int64_t k, int64_t n, int m, int num_sms, int ctas_per_sm) {
  const int64_t strips = n / 128, nblk = k / 128;
  // Never more CTAs than fit at once (rounding up made e.g. 16 strips x 17 splits = 272 > 264 CTAs,
  // and the 8 CTAs of the second wave cost a whole extra CTA time: 11.3 vs 8.2 us on the H200, docs/cuda-kernels.md), and
  // at most 8 input blocks per CTA (the activation slice lives in shared memory).
  auto splits_for = [&](int per_sm) {
    const int64_t target = static_cast<int64_t>(per_sm) * num_sms;
    int64_t splits = std::max<int64_t>(1, target / strips);
    splits = std::min(splits, nblk);
    return std::max(splits, (nblk + exl3cuda::kGemvMaxBlocksPerSplit - 1) / exl3cuda::kGemvMaxBlocksPerSplit);
  };
  // The last CTA of a strip reads S x m x 512 bytes of partials, so aim at half as many CTAs when that
  // finish outweighs a CTA's decode of more blocks: many rows (measured: m = 16 wq_a -17%, shared_gate
  // -10..13%, the others within +-3%), or more than 8 splits (measured, m <= 8: wq_a 32 -> 16 splits
  // -1..9%, shared_gate 16 -> 8 -3..9%; at 8 splits halving is worse, shared_down 8 -> 4 +3..15%).
  if (m > 8 || splits_for(ctas_per_sm) > 8) ctas_per_sm = std::max(1, ctas_per_sm / 2);
  return static_cast<int>(splits_for(ctas_per_sm));
}

void CheckExl3LinearShape(const Exl3DeviceLinear& w, const std::string& who) {
  if (w.K < 1 || w.K > 8) throw std::runtime_error(who + ": K = " + std::to_string(w.K) + " (must be 1..8)");
  if (w.codebook < 0 || w.codebook > 2) throw std::runtime_error(who + ": unknown codebook " + std::to_string(w.codebook));
  if (w.k <= 0 || w.n <= 0 || w.k % 128 || w.n % 128)
    throw std::runtime_error(who + ": k = " + std::to_string(w.k) + ", n = " + std::to_string(w.n) +
                             " (both must be positive multiples of 128)");
}

void CheckExl3LinearCall(const Exl3DeviceLinear& w, const void* x, const void* y, int workspace_device,
                         const std::string& who) {
  if (!w.trellis || !w.suh || !w.svh || !x || !y) throw std::runtime_error(who + ": null device pointer");
  if (!Aligned(w.trellis, 16) || !Aligned(w.suh, 8) || !Aligned(w.svh, 8) || !Aligned(x, 8) || !Aligned(y, 16))
    throw std::runtime_error(who + ": misaligned pointer (trellis and y need 16 bytes, x/suh/svh 8)");
  int dev = 0;
  CudaCheck(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev != workspace_device)
    throw std::runtime_error(who + ": workspace belongs to device " + std::to_string(workspace_device) +
                             ", current device is " + std::to_string(dev));
}

bool Exl3GemvBatchable(const Exl3DeviceLinear& a, const Exl3DeviceLinear& b) {
  return a.K == b.K && a.codebook == b.codebook && a.k == b.k;
}

void Exl3Gemv(const Exl3DeviceLinear& w, const uint16_t* x, int m, void* y, Exl3Out out, Exl3GemvWorkspace& ws,
              cudaStream_t stream) {
  const Exl3GemvJob job{&w, x, y};
  Exl3GemvBatch(&job, 1, m, out, ws, stream);
}

void Exl3GemvBatch(const Exl3GemvJob* jobs, int count, int m, Exl3Out out, Exl3GemvWorkspace& ws,
                   cudaStream_t stream) {
  if (count < 1 || count > kExl3GemvMaxBatch)
    throw std::runtime_error("EXL3 GEMV batch of " + std::to_string(count) + " linears (takes 1.." +
                             std::to_string(kExl3GemvMaxBatch) + ")");
  const Exl3DeviceLinear& w0 = *jobs[0].w;
  std::string who = "EXL3 GEMV '" + w0.name + "'";
  if (count > 1) who += " (batch of " + std::to_string(count) + ")";
  int64_t total_n = 0;
  for (int j = 0; j < count; ++j) {
    const Exl3DeviceLinear& w = *jobs[j].w;
    const std::string name = "EXL3 GEMV '" + w.name + "'";
    CheckExl3LinearShape(w, name);
    CheckExl3LinearCall(w, jobs[j].x, jobs[j].y, ws.device_, name);
    if (!Exl3GemvBatchable(w0, w))
      throw std::runtime_error(who + ": '" + w.name + "' differs in K, codebook or k and cannot share the launch");
    if (jobs[j].accumulate && out != Exl3Out::kF32) throw std::runtime_error(name + ": accumulates into fp16");
    total_n += w.n;
  }
  if (m < 1 || m > kExl3GemvMaxRows)
    throw std::runtime_error(who + ": m = " + std::to_string(m) + " rows (the GEMV takes 1..16)");
  if (!ws.bound_) {
    ws.bound_ = true;
    ws.stream_ = stream;
  } else if (ws.stream_ != stream) {
    throw std::runtime_error(who + ": workspace is bound to another stream; use one Exl3GemvWorkspace per stream");
  }

  const int splits = Exl3GemvSplits(w0.k, total_n, m, ws.num_sms_, ws.ctas_per_sm_);
  if (splits > 1) {
    const size_t need = static_cast<size_t>(splits) * m * total_n * sizeof(float);
    if (need > ws.partial_bytes_)
      throw std::runtime_error(who + ": needs " + std::to_string(need) + " bytes of split-K scratch, workspace has " +
                               std::to_string(ws.partial_bytes_));
    if (total_n / 128 > ws.num_counters_) throw std::runtime_error(who + ": n too large for the workspace counters");
  }
  exl3cuda::GemvBatch b{};
  b.jobs = count;
  int strips = 0;
  size_t partial_offset = 0;
  for (int j = 0; j < count; ++j) {
    const Exl3DeviceLinear& w = *jobs[j].w;
    exl3cuda::GemvParams& p = b.job[j];
    p.x = jobs[j].x;
    p.trellis = w.trellis;
    p.suh = w.suh;
    p.svh = w.svh;
    p.y = jobs[j].y;
    p.m = m;
    p.k = static_cast<int>(w.k);
    p.n = static_cast<int>(w.n);
    p.splits = splits;
    p.y_fp16 = out == Exl3Out::kF16;
    p.y_accumulate = jobs[j].accumulate ? 1 : 0;
    p.one = 1;
    if (splits > 1) {  // each job its own partials and arrival counters
      p.partial = ws.partial_ + partial_offset;
      p.counters = ws.counters_ + strips;
      partial_offset += static_cast<size_t>(splits) * m * w.n;
    }
    b.strip_begin[j] = strips;
    strips += static_cast<int>(w.n / 128);
  }
  int err = 0;
  switch (w0.codebook) {
    case 0: err = exl3cuda::LaunchGemv3Inst(w0.K, b, strips, splits, stream); break;
    case 1: err = exl3cuda::LaunchGemvMcg(w0.K, b, strips, splits, stream); break;
    default: err = exl3cuda::LaunchGemvMul1(w0.K, b, strips, splits, stream); break;
  }
  CudaCheck(static_cast<cudaError_t>(err), who + " launch");
}

void Exl3Reconstruct(const Exl3DeviceLinear& w, uint16_t* what, cudaStream_t stream) {
  const std::string who = "EXL3 reconstruct '" + w.name + "'";
  if (w.K < 1 || w.K > 8 || w.codebook < 0 || w.codebook > 2 || w.k <= 0 || w.n <= 0 || w.k % 16 || w.n % 16)
    throw std::runtime_error(who + ": bad K, codebook or shape");
  if (!w.trellis || !what) throw std::runtime_error(who + ": null device pointer");
  if (!Aligned(w.trellis, 4) || !Aligned(what, 16))
    throw std::runtime_error(who + ": trellis must be 4-byte aligned and the output 16-byte aligned");
  exl3cuda::ReconstructParams p{};
  p.trellis = w.trellis;
  p.what = what;
  p.k = static_cast<int>(w.k);
  p.n = static_cast<int>(w.n);
  p.one = 1;
  CudaCheck(static_cast<cudaError_t>(exl3cuda::LaunchReconstruct(w.K, w.codebook, p, stream)), who + " launch");
}

}  // namespace dsmesh

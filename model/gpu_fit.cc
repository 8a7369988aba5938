#include "model/gpu_fit.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "common/safetensors.h"
#include "model/config.h"

namespace dsmesh {
namespace {

std::string GiB(int64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return s;
}

}  // namespace

std::string GpuFitProblem(const GpuFitSizes& s) {
  const int64_t need = s.weight_bytes + s.kv_bytes;
  if (need <= s.free_bytes) return "";
  const std::string split =
      s.world > 1 ? " (the pack over --world " + std::to_string(s.world) + ")" : std::string(" (the whole pack)");
  return s.model + " does not fit on " + s.device + ": its weights need at least " + GiB(s.weight_bytes) + split +
         " and " + s.kv_what + " " + GiB(s.kv_bytes) + ", " + GiB(need) + " in all, but the GPU has " +
         GiB(s.free_bytes) + " free (of " + GiB(s.total_bytes) +
         "). Serve a smaller pack, split the model over more GPUs (one worker per GPU with --world N, as "
         "deploy/systemd runs them), or run on the CPU with --device cpu";
}

int64_t ShardWeightBytesAtLeast(const std::string& dir, int world) {
  const Checkpoint ck = Checkpoint::Open(dir);
  int64_t bytes = 0;
  for (const std::string& name : ck.names()) {
    if (name.find("tid2eid") != std::string::npos) continue;  // hash-routing tables: read on the host
    bytes += static_cast<int64_t>(ck.Get(name).nbytes());
  }
  return bytes / std::max(world, 1);
}

int64_t MinimumKvPoolBytes(const std::string& dir, KvCacheDtype dtype) {
  const KvLayout l = ComputeKvLayout(ModelConfig::FromDirectory(dir), dtype);
  return l.FixedBytesPerSequence() + static_cast<int64_t>(std::ceil(l.BlockBytes()));
}

void RequireModelFitsGpu(const std::string& dir, int world, int cuda_device, int64_t kv_bytes, KvCacheDtype dtype,
                         double settle_s) {
  // No directory (a synthetic source such as "synthetic:v4-flash" has no files to measure, and a missing one is
  // LoadModel's to name): nothing to check.
  if (!std::filesystem::is_directory(dir)) return;
  GpuFitSizes s;
  s.model = dir;
  s.device = "cuda:" + std::to_string(cuda_device);
  s.world = world;
  s.weight_bytes = ShardWeightBytesAtLeast(dir, world);
  s.kv_bytes = kv_bytes > 0 ? kv_bytes : MinimumKvPoolBytes(dir, dtype);
  s.kv_what = kv_bytes > 0 ? std::string("its KV pool (--kv-memory)")
                           : std::string("the smallest KV pool (one sequence and one block, ") + KvCacheDtypeName(dtype) + ")";
  if (cudaSetDevice(cuda_device) != cudaSuccess)
    throw std::runtime_error("cudaSetDevice(" + std::to_string(cuda_device) + ") failed");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(settle_s);
  for (;;) {
    size_t free_b = 0, total_b = 0;
    const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("cudaMemGetInfo on ") + s.device + " failed: " + cudaGetErrorString(e));
    s.free_bytes = static_cast<int64_t>(free_b);
    s.total_bytes = static_cast<int64_t>(total_b);
    const std::string problem = GpuFitProblem(s);
    if (problem.empty()) return;
    const bool might_free = s.weight_bytes + s.kv_bytes <= s.total_bytes;
    if (!might_free || std::chrono::steady_clock::now() >= deadline) throw ModelDoesNotFitGpu(problem);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

}  // namespace dsmesh

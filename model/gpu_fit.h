// Does a model fit the GPU it is about to be loaded on? Asked before any weight is uploaded (the worker
// at start, the single-process commands before they load), so a model too large for the device is refused
// with both sizes named instead of failing halfway through the upload with a CUDA out-of-memory error.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "model/kv_layout.h"

namespace dsmesh {

struct GpuFitSizes {
  std::string model;         // the model directory, for the message
  std::string device;        // "cuda:0"
  int world = 1;             // tensor-parallel ranks the weights are split over
  int64_t weight_bytes = 0;  // this rank's weights (at least)
  int64_t kv_bytes = 0;      // the KV pool this rank allocates (at least)
  std::string kv_what;       // where kv_bytes comes from: "--kv-memory", "the smallest KV pool ..."
  int64_t free_bytes = 0;    // what cudaMemGetInfo reports free on the device
  int64_t total_bytes = 0;   // and its total
};

// "" when weight_bytes + kv_bytes fit in free_bytes; else one message that names the model, the device,
// both sizes (needed and free) and what to do instead (a smaller pack, more GPUs, --device cpu).
std::string GpuFitProblem(const GpuFitSizes& s);

// A lower bound of one rank's weight bytes in device memory: the bytes of the tensors in `dir`'s
// safetensors files (as read from their headers; the routing tables that stay in host memory left out)
// over `world`. With world 1 it is the upload's size but for small f32 conversions; with world > 1 the
// replicated tensors (the embedding) make a rank hold more.
int64_t ShardWeightBytesAtLeast(const std::string& dir, int world);

// The smallest KV pool of `dir`'s model in `dtype`: one sequence's fixed state and one block of entries.
int64_t MinimumKvPoolBytes(const std::string& dir, KvCacheDtype dtype);

struct ModelDoesNotFitGpu : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Measures `cuda_device`'s free memory (cudaMemGetInfo; selects the device) and throws ModelDoesNotFitGpu
// with GpuFitProblem's message when `dir`'s shard for `world` ranks plus `kv_bytes` (0: the smallest pool in
// `dtype`) does not fit. When the model would fit the device's total but not what is free now, it measures
// again for up to `settle_s` seconds first: a process that just died (a worker restarted after a kill) may
// still be handing its memory back. Synthetic sources (no files) and a `dir` that is no directory (the
// loader's error says so) are not checked.
void RequireModelFitsGpu(const std::string& dir, int world, int cuda_device, int64_t kv_bytes, KvCacheDtype dtype,
                         double settle_s = 0);

}  // namespace dsmesh

#include "cli/model_commands/load_model.h"

#include <cstdio>
#include <exception>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_choice.h"
#include "model/gpu_fit.h"
#include "model/kv_layout.h"
#include "model/state_pool.h"

namespace dsmesh {

std::unique_ptr<Model> LoadForCli(const Flags& f) {
  std::string dir = f.Require("model");
  int threads = static_cast<int>(f.GetInt("threads", 0));
  const DeviceChoice choice = ChooseDevice(f);
  int device = -1;
  try {
    device = ParseDeviceFlag(choice.device);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  std::fprintf(stderr, "[load] %s\n", choice.Line().c_str());
  KvCacheDtype kv_dtype = KvCacheDtype::kF32;
  try {
    if (f.Has("kv-cache-dtype")) kv_dtype = ParseKvCacheDtype(f.Get("kv-cache-dtype"));
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  if (device >= 0) {
    RequireCudaDevice(device, "--device " + choice.device);
    RequireModelFitsGpu(dir, 1, device, 0, kv_dtype);
  }
  CudaBackendOptions cuda = CudaBackendOptionsFromEnvironment();  // DSMESH_CUDA_* / DSMESH_EXL3_* A/B variants and tuning
  cuda.cuda_graphs = !f.Has("enforce-eager");
  auto model = LoadModel(dir, ShardSpec{0, 1}, device >= 0 ? MakeCudaBackend(device, cuda) : MakeCpuBackend(threads));
  std::fprintf(stderr, "[load] %s: %s\n", dir.c_str(), model->WeightsDescription().c_str());
  if (f.Has("kv-cache-dtype")) {
    StatePoolOptions pool;
    pool.kv_dtype = kv_dtype;
    std::fprintf(stderr, "[load] %s\n", model->ConfigureStatePool(pool).Describe().c_str());
  }
  return model;
}

}  // namespace dsmesh

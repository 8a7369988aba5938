// libcupti.so.13's entry points, loaded with dlopen once per process the first time they are asked for:
// the loader's search path first (LD_LIBRARY_PATH, where the GPU bundle's lib/ is), then the CUDA toolkit's
// usual folders. Nothing links libcupti, so no binary needs it to start; only a trace fails, with the
// reason, where it is missing (kernels/cuda/cupti_timeline.h).
#pragma once

#include <cupti.h>

#include <cstdint>
#include <string>

namespace dsmesh {

struct CuptiLibrary {
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) dropped_records = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  decltype(&cuptiGetCallbackName) callback_name = nullptr;
  std::string error;  // why loading failed; "" when every entry point is there
};

// The library as loaded (check `error`).
const CuptiLibrary& Cupti();
// The library, or throws std::runtime_error saying why it could not be loaded.
const CuptiLibrary& LoadedCupti();
// Throws std::runtime_error "CUPTI: <what>: <CUPTI's message>" unless `r` is CUPTI_SUCCESS.
void CheckCupti(CUptiResult r, const std::string& what);

// Why CUPTI cannot be loaded here ("" when it loads): the library not found (with the paths tried) or an
// entry point missing. Needs no GPU.
std::string CuptiLoadError();

// The name of a CUDA runtime call as the timeline's records carry it: CUPTI's callback name without its
// version suffix ("cudaGraphLaunch_v10000" -> "cudaGraphLaunch"). Needs CUPTI loaded, not a GPU.
std::string CuptiRuntimeCallName(uint32_t cbid);

}  // namespace dsmesh

// A device timeline recorded by CUPTI's activity API (`dsmesh bench --timeline`): every kernel (each node
// of a graph launch too: it carries the graph's id and the launch's correlation id), copy and memset with
// device timestamps, and every CUDA runtime call with host timestamps, on one clock that Now() also reads.
// The records come out as kernels/timeline's plain TimelineRecord, for AnalyzeStepTimeline.
//
// libcupti.so.13 is loaded with dlopen the first time a timeline starts (the loader's search path first,
// where the GPU bundle's lib/ is, then the CUDA toolkit's usual folders), so that no binary needs CUPTI to
// start and only a trace fails, with the reason, when it is missing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/timeline/timeline_record.h"

namespace dsmesh {

struct TimelineTrace {
  std::vector<TimelineRecord> records;
  uint64_t dropped = 0;  // records CUPTI reported dropped (none expected: buffers are requested on demand)
};

// Collects from construction until Finish. One at a time per process (CUPTI's activity buffers are the
// process's); the records of every thread and stream of the process are collected.
class CuptiTimeline {
 public:
  // Loads CUPTI, registers the buffer callbacks (once per process) and enables kernel, copy, memset and
  // runtime-call records. Throws std::runtime_error saying what failed.
  CuptiTimeline();
  // Stops collecting when Finish was not called (the records are dropped).
  ~CuptiTimeline();
  CuptiTimeline(const CuptiTimeline&) = delete;
  CuptiTimeline& operator=(const CuptiTimeline&) = delete;

  // CUPTI's clock (cuptiGetTimestamp), the one the records' timestamps use: the host marks step windows
  // with it.
  uint64_t Now() const;
  // Waits for the device, stops collecting and returns what was recorded since construction (once).
  TimelineTrace Finish();

 private:
  bool finished_ = false;
};

// Why CUPTI cannot be loaded here ("" when it loads): the library not found (with the paths tried) or an
// entry point missing. Needs no GPU.
std::string CuptiLoadError();

// The name of a CUDA runtime call as the records carry it: CUPTI's callback name without its version
// suffix ("cudaGraphLaunch_v10000" -> "cudaGraphLaunch"). Needs CUPTI loaded, not a GPU.
std::string CuptiRuntimeCallName(uint32_t cbid);

}  // namespace dsmesh

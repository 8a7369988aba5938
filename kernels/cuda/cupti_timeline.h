// A device timeline recorded by CUPTI's activity API (`dsmesh bench --timeline`): every kernel (each node
// of a graph launch too: it carries the graph's id and the launch's correlation id), copy and memset with
// device timestamps, and every CUDA runtime call with host timestamps, on one clock that Now() also reads.
// The records come out as kernels/timeline's plain TimelineRecord, for AnalyzeStepTimeline.
// CUPTI itself is loaded at run time (kernels/cuda/cupti_library.h).
#pragma once

#include <cstdint>
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

}  // namespace dsmesh

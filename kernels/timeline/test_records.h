// Hand-made timeline records for tests of the analysis and its report.
#pragma once

#include <cstdint>

#include "kernels/timeline/timeline_record.h"

namespace dsmesh {

// A runtime call (cudaGraphLaunch, cudaLaunchKernel, ...) with its correlation id, on the host.
inline TimelineRecord Call(uint32_t corr, const char* name, uint64_t start, uint64_t end) {
  TimelineRecord r;
  r.kind = TimelineKind::kApi;
  r.correlation_id = corr;
  r.name = name;
  r.start_ns = start;
  r.end_ns = end;
  return r;
}

// Device work (a kernel, copy or memset) launched by call `corr`, in graph `graph` (0: none).
inline TimelineRecord Work(TimelineKind kind, uint32_t corr, uint32_t graph, const char* name, uint64_t start,
                           uint64_t end, uint64_t bytes = 0) {
  TimelineRecord r;
  r.kind = kind;
  r.correlation_id = corr;
  r.graph_id = graph;
  r.name = name;
  r.start_ns = start;
  r.end_ns = end;
  r.bytes = bytes;
  return r;
}

}  // namespace dsmesh

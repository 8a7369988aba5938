#include "kernels/cuda/cupti_timeline.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "kernels/cuda/cupti_library.h"

namespace dsmesh {
namespace {

// The records the callbacks deliver while a timeline is open; the callbacks run on CUPTI's threads and in
// cuptiActivityFlushAll.
struct Sink {
  std::mutex mu;
  bool open = false;
  std::vector<TimelineRecord> records;
  uint64_t dropped = 0;
  std::unordered_map<uint32_t, std::string> call_names;  // runtime callback id -> name
};

Sink& TheSink() {
  static Sink* sink = new Sink;  // never destroyed: CUPTI may deliver a buffer while the process exits
  return *sink;
}

std::atomic<bool> timeline_open{false};

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME};

const char* MemoryKindName(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return "pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return "pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED: return "managed";
    default: return nullptr;
  }
}

// "memcpy HtoD (pinned)": the direction, and the host side's memory kind (a pageable copy stages through
// a driver buffer, so it is worth seeing).
std::string CopyName(const CUpti_ActivityMemcpy6& m) {
  const char* dir = "?";
  const char* host = nullptr;
  switch (m.copyKind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: dir = "HtoD"; host = MemoryKindName(m.srcKind); break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: dir = "DtoH"; host = MemoryKindName(m.dstKind); break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: dir = "DtoD"; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: dir = "HtoH"; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: dir = "PtoP"; break;
    default: dir = "array"; break;
  }
  std::string s = std::string("memcpy ") + dir;
  if (host) s += std::string(" (") + host + ")";
  return s;
}

// Appends `rec` as a TimelineRecord when it is one of the enabled kinds with timestamps. Under the sink's
// lock (the runtime call names are cached there).
void Convert(const CUpti_Activity* rec, Sink& sink) {
  TimelineRecord r;
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      r.kind = TimelineKind::kKernel;
      r.start_ns = k->start;
      r.end_ns = k->end;
      r.correlation_id = k->correlationId;
      r.graph_id = k->graphId;
      r.stream_id = k->streamId;
      r.name = k->name ? k->name : "(unnamed kernel)";
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      r.kind = TimelineKind::kMemcpy;
      r.start_ns = m->start;
      r.end_ns = m->end;
      // The runtime call's id when CUPTI gives it (the records' calls are runtime calls), else the driver's.
      r.correlation_id = m->runtimeCorrelationId ? m->runtimeCorrelationId : m->correlationId;
      r.graph_id = m->graphId;
      r.stream_id = m->streamId;
      r.bytes = m->bytes;
      r.name = CopyName(*m);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      r.kind = TimelineKind::kMemset;
      r.start_ns = m->start;
      r.end_ns = m->end;
      r.correlation_id = m->correlationId;
      r.graph_id = m->graphId;
      r.stream_id = m->streamId;
      r.bytes = m->bytes;
      r.name = "memset";
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      r.kind = TimelineKind::kApi;
      r.start_ns = a->start;
      r.end_ns = a->end;
      r.correlation_id = a->correlationId;
      auto [it, added] = sink.call_names.try_emplace(a->cbid);
      if (added) it->second = CuptiRuntimeCallName(a->cbid);
      r.name = it->second;
      break;
    }
    default: return;
  }
  if (r.start_ns == 0 && r.end_ns == 0) return;  // CUPTI could not time it
  sink.records.push_back(std::move(r));
}

// CUPTI wants buffers of at least 1 KiB aligned to 8 bytes; 8 MiB holds some 40,000 kernel records.
constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  const CuptiLibrary& api = Cupti();
  Sink& sink = TheSink();
  {
    std::lock_guard<std::mutex> lock(sink.mu);
    if (sink.open && valid > 0) {
      CUpti_Activity* rec = nullptr;
      while (api.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) Convert(rec, sink);
    }
    size_t dropped = 0;
    if (sink.open && api.dropped_records(context, stream, &dropped) == CUPTI_SUCCESS) sink.dropped += dropped;
  }
  std::free(buffer);
}

}  // namespace

CuptiTimeline::CuptiTimeline() {
  const CuptiLibrary& api = LoadedCupti();
  if (timeline_open.exchange(true)) throw std::runtime_error("CUPTI: a timeline is already being collected");
  try {
    static const CUptiResult registered = api.register_callbacks(BufferRequested, BufferCompleted);
    CheckCupti(registered, "cuptiActivityRegisterCallbacks");
    {
      Sink& sink = TheSink();
      std::lock_guard<std::mutex> lock(sink.mu);
      sink.records.clear();
      sink.dropped = 0;
      sink.open = true;
    }
    for (CUpti_ActivityKind k : kKinds)
      CheckCupti(api.enable(k), "cuptiActivityEnable(kind " + std::to_string(static_cast<int>(k)) + ")");
  } catch (...) {
    for (CUpti_ActivityKind k : kKinds) api.disable(k);
    std::lock_guard<std::mutex> lock(TheSink().mu);
    TheSink().open = false;
    timeline_open = false;
    throw;
  }
}

CuptiTimeline::~CuptiTimeline() {
  if (finished_) return;
  try {
    Finish();
  } catch (...) {
    // A destructor must not throw; the records are dropped either way.
  }
}

uint64_t CuptiTimeline::Now() const {
  uint64_t t = 0;
  CheckCupti(Cupti().timestamp(&t), "cuptiGetTimestamp");
  return t;
}

TimelineTrace CuptiTimeline::Finish() {
  if (finished_) throw std::logic_error("CuptiTimeline::Finish called twice");
  finished_ = true;
  const CuptiLibrary& api = Cupti();
  // Every record must be complete before the flush hands the buffers over (the flush does not wait).
  const cudaError_t synced = cudaDeviceSynchronize();
  for (CUpti_ActivityKind k : kKinds) api.disable(k);
  const CUptiResult flushed = api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  TimelineTrace trace;
  {
    Sink& sink = TheSink();
    std::lock_guard<std::mutex> lock(sink.mu);
    sink.open = false;
    trace.records = std::move(sink.records);
    sink.records.clear();
    trace.dropped = sink.dropped;
  }
  timeline_open = false;
  if (synced != cudaSuccess)
    throw std::runtime_error(std::string("CUPTI timeline: cudaDeviceSynchronize: ") + cudaGetErrorString(synced));
  CheckCupti(flushed, "cuptiActivityFlushAll");
  return trace;
}

}  // namespace dsmesh

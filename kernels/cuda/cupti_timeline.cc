#include "kernels/cuda/cupti_timeline.h"

#include <cuda_runtime.h>
#include <cupti.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace dsmesh {
namespace {

// libcupti's entry points this file calls, looked up once per process.
struct CuptiApi {
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

CuptiApi LoadCupti() {
  CuptiApi api;
  // The bare name first: LD_LIBRARY_PATH (the GPU bundle's lib/) and the loader's cache; then the toolkit.
  const char* candidates[] = {"libcupti.so.13", "/usr/local/cuda/lib64/libcupti.so.13",
                              "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
                              "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13"};
  void* lib = nullptr;
  std::string tried;
  for (const char* c : candidates) {
    lib = dlopen(c, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    const char* why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why ? why : c);
  }
  if (!lib) {
    api.error = "CUPTI (libcupti.so.13) could not be loaded (" + tried +
                "): the GPU bundle ships it in its lib/ folder (put that on LD_LIBRARY_PATH); a CUDA 13 toolkit has it "
                "in /usr/local/cuda/lib64";
    return api;
  }
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && api.error.empty()) api.error = std::string("CUPTI: libcupti.so.13 has no ") + name;
  };
  bind(api.enable, "cuptiActivityEnable");
  bind(api.disable, "cuptiActivityDisable");
  bind(api.register_callbacks, "cuptiActivityRegisterCallbacks");
  bind(api.flush_all, "cuptiActivityFlushAll");
  bind(api.next_record, "cuptiActivityGetNextRecord");
  bind(api.dropped_records, "cuptiActivityGetNumDroppedRecords");
  bind(api.timestamp, "cuptiGetTimestamp");
  bind(api.result_string, "cuptiGetResultString");
  bind(api.callback_name, "cuptiGetCallbackName");
  return api;
}

const CuptiApi& Cupti() {
  static const CuptiApi api = LoadCupti();
  return api;
}

const CuptiApi& LoadedCupti() {
  const CuptiApi& api = Cupti();
  if (!api.error.empty()) throw std::runtime_error(api.error);
  return api;
}

void Check(CUptiResult r, const std::string& what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  if (Cupti().result_string(r, &s) != CUPTI_SUCCESS || !s) s = "unknown CUPTI error";
  throw std::runtime_error("CUPTI: " + what + ": " + s);
}

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
  const CuptiApi& api = Cupti();
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

std::string CuptiLoadError() { return Cupti().error; }

std::string CuptiRuntimeCallName(uint32_t cbid) {
  const CuptiApi& api = LoadedCupti();
  const char* name = nullptr;
  if (api.callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name) != CUPTI_SUCCESS || !name)
    return "runtime call " + std::to_string(cbid);
  std::string s = name;
  const size_t v = s.rfind("_v");
  if (v != std::string::npos && v + 2 < s.size() && s.find_first_not_of("0123456789", v + 2) == std::string::npos)
    s.resize(v);
  return s;
}

CuptiTimeline::CuptiTimeline() {
  const CuptiApi& api = LoadedCupti();
  if (timeline_open.exchange(true)) throw std::runtime_error("CUPTI: a timeline is already being collected");
  try {
    static const CUptiResult registered = api.register_callbacks(BufferRequested, BufferCompleted);
    Check(registered, "cuptiActivityRegisterCallbacks");
    {
      Sink& sink = TheSink();
      std::lock_guard<std::mutex> lock(sink.mu);
      sink.records.clear();
      sink.dropped = 0;
      sink.open = true;
    }
    for (CUpti_ActivityKind k : kKinds) Check(api.enable(k), "cuptiActivityEnable(kind " + std::to_string(static_cast<int>(k)) + ")");
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
  Check(Cupti().timestamp(&t), "cuptiGetTimestamp");
  return t;
}

TimelineTrace CuptiTimeline::Finish() {
  if (finished_) throw std::logic_error("CuptiTimeline::Finish called twice");
  finished_ = true;
  const CuptiApi& api = Cupti();
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
  Check(flushed, "cuptiActivityFlushAll");
  return trace;
}

}  // namespace dsmesh

#include "kernels/cuda/op_profiler.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/op_bytes.h"

namespace dsmesh {

OpProfiler::OpProfiler(cudaStream_t stream, bool device_only) : stream_(stream), device_only_(device_only) {
  int device = 0;
  CudaCheck(cudaGetDevice(&device), "cudaGetDevice (op profiler)");
  peak_bytes_per_s_ = DeviceMemoryBandwidth(device, &peak_source_);
  CudaCheck(cudaMallocHost(&ids_host_, kIdsCapacity * sizeof(int32_t)), "cudaMallocHost (op profiler ids)");
}

OpProfiler::~OpProfiler() {
  cudaStreamSynchronize(stream_);  // a deferred ids copy may still write the staging buffer
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
  for (cudaEvent_t e : used_) cudaEventDestroy(e);
  cudaFreeHost(ids_host_);
}

double DeviceMemoryBandwidth(int device, std::string* source) {
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess || clock_khz <= 0 ||
      bus_bits <= 0) {
    cudaGetLastError();
    *source = "the H200 data sheet's 4.8 TB/s (the device reports no memory clock or bus width)";
    return 4.8e12;
  }
  const double peak = 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
  char line[160];
  std::snprintf(line, sizeof(line), "device attributes: memory clock %.0f MHz x %d-bit bus x 2 = %.2f TB/s",
                clock_khz / 1e3, bus_bits, peak / 1e12);
  *source = line;
  return peak;
}

cudaEvent_t OpProfiler::NewEvent() {
  cudaEvent_t e;
  if (!free_.empty()) {
    e = free_.back();
    free_.pop_back();
  } else {
    CudaCheck(cudaEventCreate(&e), "cudaEventCreate (op profiler)");
  }
  used_.push_back(e);
  return e;
}

// Longer than the host takes to enqueue any one op (a few launches and metadata copies).
constexpr int64_t kSpinNs = 200 * 1000;

void OpProfiler::Begin(const std::string& op) {
  if (depth_++ > 0) return;
  open_op_ = phases_.empty() ? op : std::string(phases_.back()) + " / " + op;
  if (device_only_) cuda_ops::Spin(kSpinNs, stream_);
  open_begin_ = NewEvent();
  CudaCheck(cudaEventRecord(open_begin_, stream_), "cudaEventRecord (op profiler)");
  open_host_ = std::chrono::steady_clock::now();
  open_bytes_ = 0;
  open_ids_.clear();
}

void OpProfiler::AddBytes(double bytes) {
  if (depth_ > 0) open_bytes_ += bytes;
}

void OpProfiler::AddDistinctIdBytes(const int32_t* dev_ids, int64_t n, double bytes_each) {
  if (depth_ > 0 && n > 0) open_ids_.push_back({dev_ids, n, bytes_each});
}

void OpProfiler::End() {
  if (--depth_ > 0) return;
  const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - open_host_).count();
  cudaEvent_t end = NewEvent();
  CudaCheck(cudaEventRecord(end, stream_), "cudaEventRecord (op profiler)");
  Interval iv{open_op_, open_begin_, end, host_ms, open_bytes_, {}};
  // The ids leave after the end event: the copy is not part of the op's interval.
  for (const IdsRequest& r : open_ids_) {
    if (ids_used_ + r.n > kIdsCapacity) {
      iv.bytes += r.bytes_each * static_cast<double>(r.n);
      continue;
    }
    CudaCheck(cudaMemcpyAsync(ids_host_ + ids_used_, r.dev, r.n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
              "op profiler: ids copy");
    iv.ids.push_back({ids_used_, r.n, r.bytes_each});
    ids_used_ += r.n;
  }
  open_ids_.clear();
  pending_.push_back(std::move(iv));
}

void OpProfiler::BeginStep() {
  step_begin_ = NewEvent();
  CudaCheck(cudaEventRecord(step_begin_, stream_), "cudaEventRecord (op profiler)");
}

void OpProfiler::EndStep() {
  if (!step_begin_) return;
  cudaEvent_t end = NewEvent();
  CudaCheck(cudaEventRecord(end, stream_), "cudaEventRecord (op profiler)");
  CudaCheck(cudaEventSynchronize(end), "op profiler: step end");
  float ms = 0;
  CudaCheck(cudaEventElapsedTime(&ms, step_begin_, end), "cudaEventElapsedTime (op profiler)");
  step_ms_ += ms;
  ++steps_;
  Collect();
  step_begin_ = nullptr;
}

void OpProfiler::Collect() {
  if (!pending_.empty()) CudaCheck(cudaEventSynchronize(pending_.back().end), "op profiler: collect");
  if (ids_used_ > 0) CudaCheck(cudaStreamSynchronize(stream_), "op profiler: ids copies");  // they follow the end events
  for (const Interval& iv : pending_) {
    float ms = 0;
    CudaCheck(cudaEventElapsedTime(&ms, iv.begin, iv.end), "cudaEventElapsedTime (op profiler)");
    OpTiming& t = totals_[iv.op];
    t.op = iv.op;
    ++t.calls;
    t.ms += ms;
    t.host_ms += iv.host_ms;
    t.bytes += iv.bytes;
    for (const DeferredIds& d : iv.ids) t.bytes += op_bytes::DistinctIdBytes(ids_host_ + d.offset, d.n, d.bytes_each);
    if (step_begin_) ops_in_steps_ms_ += ms;
  }
  pending_.clear();
  ids_used_ = 0;
  free_.insert(free_.end(), used_.begin(), used_.end());
  used_.clear();
}

OpProfile OpProfiler::Take() {
  Collect();
  OpProfile out;
  for (auto& [name, t] : totals_) out.ops.push_back(t);
  std::sort(out.ops.begin(), out.ops.end(), [](const OpTiming& a, const OpTiming& b) { return a.ms > b.ms; });
  out.steps = steps_;
  out.step_ms = step_ms_;
  out.between_ms = step_ms_ - ops_in_steps_ms_;
  out.peak_bytes_per_s = peak_bytes_per_s_;
  out.peak_source = peak_source_;
  totals_.clear();
  step_ms_ = ops_in_steps_ms_ = 0;
  steps_ = 0;
  return out;
}

std::string LinearOpName(const std::string& weight_name) {
  // Drop "layers.N." / "mtp.N." prefixes and any ".N." expert index: one name per kind of linear.
  std::string out;
  size_t i = 0;
  const std::string& s = weight_name;
  while (i < s.size()) {
    size_t j = s.find('.', i);
    if (j == std::string::npos) j = s.size();
    const std::string part = s.substr(i, j - i);
    const bool number = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(c); });
    if (!number && part != "layers" && part != "model") {
      if (!out.empty()) out += '.';
      out += part;
    }
    i = j + 1;
  }
  return out.empty() ? weight_name : out;
}

}  // namespace dsmesh

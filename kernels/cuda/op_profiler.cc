#include "kernels/cuda/op_profiler.h"

#include <algorithm>
#include <cctype>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/model_ops.h"

namespace dsmesh {

OpProfiler::~OpProfiler() {
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
  for (cudaEvent_t e : used_) cudaEventDestroy(e);
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
}

void OpProfiler::End() {
  if (--depth_ > 0) return;
  const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - open_host_).count();
  cudaEvent_t end = NewEvent();
  CudaCheck(cudaEventRecord(end, stream_), "cudaEventRecord (op profiler)");
  pending_.push_back({open_op_, open_begin_, end, host_ms});
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
  for (const Interval& iv : pending_) {
    float ms = 0;
    CudaCheck(cudaEventElapsedTime(&ms, iv.begin, iv.end), "cudaEventElapsedTime (op profiler)");
    OpTiming& t = totals_[iv.op];
    t.op = iv.op;
    ++t.calls;
    t.ms += ms;
    t.host_ms += iv.host_ms;
    if (step_begin_) ops_in_steps_ms_ += ms;
  }
  pending_.clear();
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

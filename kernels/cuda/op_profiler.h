// Times the backend's ops with CUDA events, for the per-op split of a decode step (`dsmesh bench
// --profile`). Each timed op records an event before and after its launches on the backend's stream;
// Collect() waits for the stream and adds each interval to its op's total. The intervals of successive
// ops tile the stream's timeline, so their sum over a step is the step's device time with the host's
// gaps between launches inside the ops; the gaps between ops are the step's total minus that sum.
// Only outermost ops are timed (SharedExpert's own Linear calls count as SharedExpert). Graph captures
// never see it: the backend runs segments eagerly while profiling. With `device_only`, each op's begin
// event waits behind a spin kernel (kernels/cuda/model_ops.h Spin) that outlasts the host's enqueueing
// of the op, so the interval is the op's device time alone (the step total then counts the spins too).
// Either way the host's time inside each op is measured with a steady clock. Ops also declare the bytes
// they must move (kernels/op_bytes.h), summed per op beside the time; the routed experts' bytes depend on
// the ids the router chose on the device, which are copied (after the op's end event, so outside its
// interval) to pinned memory and counted when the step is collected.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace dsmesh {

class OpProfiler {
 public:
  // The device is the current one (its memory bandwidth is the peak the bytes are measured against).
  OpProfiler(cudaStream_t stream, bool device_only);
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  // The phase of the ops that follow (see Backend::BeginPhase).
  void BeginPhase(const char* phase) { phases_.push_back(phase); }
  void EndPhase() {
    if (!phases_.empty()) phases_.pop_back();
  }
  // Brackets one op; nested Begin/End pairs are folded into the outermost one.
  void Begin(const std::string& op);
  void End();
  // Adds to the open outermost op's bytes (a nested op's bytes count in the op that called it).
  void AddBytes(double bytes);
  // Adds bytes_each for every distinct non-negative id among the n int32 ids at dev_ids (device memory
  // the op's launches have written or read by its end): the routed experts an op must read.
  void AddDistinctIdBytes(const int32_t* dev_ids, int64_t n, double bytes_each);
  // Brackets a whole step (BeginStep .. EndStep); the intervals of ops inside it are Collected at End.
  void BeginStep();
  void EndStep();

  // Totals since the last Take.
  OpProfile Take();

 private:
  cudaEvent_t NewEvent();
  void Collect();

  // Ids copied to the pinned staging buffer at `offset`, each distinct one worth bytes_each.
  struct DeferredIds {
    int64_t offset, n;
    double bytes_each;
  };
  struct Interval {
    std::string op;
    cudaEvent_t begin, end;
    double host_ms;
    double bytes;
    std::vector<DeferredIds> ids;
  };
  struct IdsRequest {
    const int32_t* dev;
    int64_t n;
    double bytes_each;
  };
  cudaStream_t stream_;
  bool device_only_;
  std::vector<const char*> phases_;
  int depth_ = 0;
  std::string open_op_;
  cudaEvent_t open_begin_ = nullptr;
  std::chrono::steady_clock::time_point open_host_;
  double open_bytes_ = 0;
  std::vector<IdsRequest> open_ids_;
  // Pinned staging of the deferred ids, refilled every step (kIdsCapacity ids; past that an op counts
  // each id as distinct, an upper bound).
  static constexpr int64_t kIdsCapacity = 1 << 18;
  int32_t* ids_host_ = nullptr;
  int64_t ids_used_ = 0;
  double peak_bytes_per_s_ = 0;
  std::string peak_source_;
  cudaEvent_t step_begin_ = nullptr;
  std::vector<Interval> pending_;
  std::vector<cudaEvent_t> free_, used_;
  std::map<std::string, OpTiming> totals_;
  double step_ms_ = 0, ops_in_steps_ms_ = 0;
  int64_t steps_ = 0;
};

// "layers.12.attn.wq_b" -> "attn.wq_b": the op name of a linear without its layer (and expert) numbers.
std::string LinearOpName(const std::string& weight_name);

// The device's memory bandwidth from its attributes (memory clock x bus width x 2 transfers per clock),
// with `source` saying so; where the attributes are missing, the H200's data-sheet 4.8 TB/s, said too.
double DeviceMemoryBandwidth(int device, std::string* source);

}  // namespace dsmesh

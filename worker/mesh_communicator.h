// The Communicator the model holds for its whole life. The mesh may be re-formed (a worker died and came
// back), which builds a new Gloo/CUDA-IPC/NCCL communicator; this wrapper forwards to the current one and
// measures the wall time spent inside collectives (the "collectives" part of the step time split).
#pragma once

#include <chrono>
#include <memory>
#include <stdexcept>

#include "common/communicator.h"

namespace dsmesh {

class MeshCommunicator final : public Communicator {
 public:
  MeshCommunicator(int rank, int world) : rank_(rank), world_(world) {}

  void Attach(std::unique_ptr<Communicator> impl) { impl_ = std::move(impl); }
  void Detach() { impl_.reset(); }
  bool attached() const { return impl_ != nullptr; }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  bool device_buffers() const override { return impl_ && impl_->device_buffers(); }
  void AllReduceSum(float* data, size_t n) override {
    Timed([&] { Impl().AllReduceSum(data, n); });
  }
  void AllGather(const float* in, size_t n, float* out) override {
    Timed([&] { Impl().AllGather(in, n, out); });
  }
  void Broadcast(void* data, size_t bytes, int root) override {
    Timed([&] { Impl().Broadcast(data, bytes, root); });
  }

  // Seconds spent in collectives since the last call (then resets).
  double TakeSeconds() {
    double s = seconds_;
    seconds_ = 0;
    return s;
  }
  long long calls() const { return calls_; }
  // Collectives since the last call (then resets).
  int TakeCalls() {
    int c = static_cast<int>(calls_ - calls_taken_);
    calls_taken_ = calls_;
    return c;
  }

 private:
  Communicator& Impl() {
    if (!impl_) throw std::runtime_error("collective called while the mesh is not formed");
    return *impl_;
  }
  template <class F>
  void Timed(F&& f) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++calls_;
  }

  int rank_, world_;
  std::unique_ptr<Communicator> impl_;
  double seconds_ = 0;
  long long calls_ = 0, calls_taken_ = 0;
};

}  // namespace dsmesh

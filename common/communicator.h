// Data-plane collectives among the workers of one mesh (tensor parallelism). Implementations:
// LocalCommunicator (world 1, here), Gloo over TCP for CPU workers and NCCL for GPU workers (worker/).
// Buffers live on the device of the backend that calls them (host memory for Gloo, device memory for NCCL).
// Every rank must issue the same collectives in the same order.
#pragma once

#include <cstddef>

namespace dsmesh {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Whether the buffers are device memory (NCCL) rather than host memory (Gloo, local).
  virtual bool device_buffers() const { return false; }
  // In-place sum over all ranks of n floats.
  virtual void AllReduceSum(float* data, size_t n) = 0;
  // Each rank contributes n floats; out receives world*n floats ordered by rank.
  virtual void AllGather(const float* in, size_t n, float* out) = 0;
  // Copies `bytes` bytes from root's buffer into every other rank's buffer.
  virtual void Broadcast(void* data, size_t bytes, int root) = 0;
};

// The single-process case: collectives are identities.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  void AllReduceSum(float*, size_t) override {}
  void AllGather(const float* in, size_t n, float* out) override {
    if (out != in)
      for (size_t i = 0; i < n; ++i) out[i] = in[i];
  }
  void Broadcast(void*, size_t, int) override {}
};

}  // namespace dsmesh

// Communicator for tensor-parallel ranks that are processes on ONE CUDA device (NCCL refuses two ranks on
// one device; Gloo would move every activation through the host). Each rank owns a device staging buffer
// that every other rank maps through CUDA IPC; the ranks meet at a barrier in POSIX shared memory.
//
// A collective, per chunk of at most `capacity` floats:
//   1. stage: copy the chunk into this rank's current staging half and wait for the copy;
//   2. barrier: every rank's chunk is staged;
//   3. read the peers' halves: AllReduceSum sums them in rank order (every rank gets the same bits),
//      AllGather copies each into its slot, Broadcast copies the root's;
//   4. the next chunk or collective stages into the other half.
// Two halves make one barrier per chunk enough: rank r writes half h again two steps later, after the
// barrier of the step in between, and a peer reaches that barrier only after its reads of half h ended
// (its own step-1 wait covers them, see "Streams").
//
// Streams. With set_stream (the worker hands over the CUDA backend's stream), the copies and the
// reduction are enqueued on that stream: staging is ordered after the kernels that produced the data, the
// wait in step 1 is the only wait of a collective whose result is device memory (the backend's next
// kernels are ordered after the reads on the same stream), and that wait also covers the reads of the
// previous collective, which is what the barrier must stand for. Without a stream, the communicator uses
// its own: it waits for the whole device before staging (the data may come from any stream) and for the
// reads after each step. A result in host memory is always waited for before the call returns.
//
// Buffers may be device memory (the forward's activations) or host memory (the head's all-gathered
// logits, host broadcasts), in any mix: AllGather takes a host `in` with a device `out` and the reverse.
// Copies use unified addressing; an AllReduceSum of host memory is reduced into a device buffer of this
// rank first and copied back. A barrier that waits longer than `timeout` (a peer died or stopped calling)
// throws std::runtime_error naming the collective and the rank; it never hangs.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "common/communicator.h"
#include "common/device_stream.h"

namespace dsmesh {

struct IpcBarrier;  // lives in the shared-memory segment

class CudaIpcCommunicator final : public Communicator {
 public:
  // Joins the ranks through `store` (handles, device UUIDs and the shared-memory name are exchanged there)
  // and checks that every rank runs on the same physical device. `capacity`: floats per staging half.
  CudaIpcCommunicator(int rank, int world, gloo::rendezvous::Store& store, int device,
                      std::chrono::milliseconds timeout, size_t capacity = size_t{4} << 20);
  ~CudaIpcCommunicator() override;
  CudaIpcCommunicator(const CudaIpcCommunicator&) = delete;
  CudaIpcCommunicator& operator=(const CudaIpcCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  bool device_buffers() const override { return true; }
  void AllReduceSum(float* data, size_t n) override;
  void AllGather(const float* in, size_t n, float* out) override;
  void Broadcast(void* data, size_t bytes, int root) override;

  // The stream (on `device`) that produces the buffers and consumes the results: the collectives are
  // enqueued on it from now on (see "Streams" above). {} (no stream): back to the communicator's own.
  // Waits for the whole device first (reads of the last collective may be queued on the former stream).
  // The stream must outlive the collectives that use it, not the communicator: its destructor waits for
  // the whole device instead.
  void set_stream(DeviceStream stream);

  // Whether all `world` ranks sit on one physical device: each publishes the UUID of its `device` under
  // KEY_PREFIX.RANK and reads everyone's, so every rank reaches the same answer (device -1: this rank is
  // on the CPU, which shares nothing). Fills `why` when not.
  static bool RanksShareOneDevice(gloo::rendezvous::Store& store, const std::string& key_prefix, int rank,
                                  int world, int device, std::string* why);
  static std::string DeviceUuid(int device);

  int64_t collectives() const { return collectives_; }
  int64_t bytes_staged() const { return bytes_; }

 private:
  float* Half() const { return staging_ + half_ * capacity_; }
  const float* PeerHalf(int r) const { return peers_[r] + half_ * capacity_; }
  cudaStream_t Stream() const { return borrowed_stream_ ? borrowed_stream_ : own_stream_; }
  // Waits for the device work the next copies must follow (see "Streams"), and for this rank's reads of
  // the previous step.
  void WaitForProducers();
  // WaitForProducers, then stages `bytes` from `src` into this rank's current half and waits for the copy.
  void Stage(const void* src, size_t bytes);
  void Barrier(const char* what);
  // Ends a step: waits for its reads where the result is bound for host memory or no stream was handed
  // over, and flips the half.
  void Finish(bool host_result);
  void Check(cudaError_t e, const char* what) const;
  void Release() noexcept;  // frees what the constructor got (the destructor, a failed constructor)

  int rank_, world_, device_;
  std::chrono::milliseconds timeout_;
  size_t capacity_;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t borrowed_stream_ = nullptr;  // set_stream's
  float* staging_ = nullptr;       // 2 x capacity_ floats, exported to the peers
  float* result_ = nullptr;        // capacity_ floats: a reduction bound for host memory lands here first
  std::vector<float*> peers_;      // every rank's staging buffer as mapped here (own at [rank_])
  IpcBarrier* barrier_ = nullptr;  // mmap'd shared memory
  size_t half_ = 0;
  int64_t collectives_ = 0, bytes_ = 0;
};

}  // namespace dsmesh

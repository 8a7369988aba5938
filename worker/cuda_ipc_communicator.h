// Communicator for tensor-parallel ranks that are processes on ONE CUDA device (NCCL refuses two ranks on
// one device; Gloo would move every activation through the host). Each rank owns a device staging buffer
// that every other rank maps through CUDA IPC; the ranks meet at a barrier in POSIX shared memory.
//
// A collective, per chunk of at most `capacity` floats:
//   1. wait for this process's device work (the values to send may still be being written), then copy
//      the chunk into this rank's staging half and wait for the copy;
//   2. barrier: every rank's chunk is staged;
//   3. read the peers' halves: AllReduceSum sums them in rank order (every rank gets the same bits),
//      AllGather copies each into its slot, Broadcast copies the root's; wait for the reads;
//   4. the next chunk or collective stages into the other half.
// Two halves make one barrier per chunk enough: rank r writes half h again two steps later, after the
// barrier of the step in between, and a peer reaches that barrier only after its reads of half h ended.
//
// Buffers may be device memory (the forward's activations) or host memory (the head's all-gathered
// logits, host broadcasts): copies use unified addressing, and a device result is written in place.
// A barrier that waits longer than `timeout` (a peer died or stopped calling) throws; it never hangs.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "common/communicator.h"

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
  // Waits for this process's device work, stages `bytes` from `src` into this rank's current half.
  void Stage(const void* src, size_t bytes);
  void Barrier(const char* what);
  void Finish();  // waits for this step's reads, flips the half
  void Check(cudaError_t e, const char* what) const;

  int rank_, world_, device_;
  std::chrono::milliseconds timeout_;
  size_t capacity_;
  cudaStream_t stream_ = nullptr;
  float* staging_ = nullptr;       // 2 x capacity_ floats, exported to the peers
  float* result_ = nullptr;        // capacity_ floats: a reduction bound for host memory lands here first
  std::vector<float*> peers_;      // every rank's staging buffer as mapped here (own at [rank_])
  IpcBarrier* barrier_ = nullptr;  // mmap'd shared memory
  size_t half_ = 0;
  int64_t collectives_ = 0, bytes_ = 0;
};

}  // namespace dsmesh

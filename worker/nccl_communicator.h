// Communicator over NCCL for GPU workers. libnccl.so.2 is opened at run time (dlopen), so binaries link
// without NCCL and a CPU-only machine runs them; asking for NCCL where it cannot load fails loudly with
// the loader's message. Rank 0 creates the unique id and publishes it through the rendezvous store.
// Collectives are enqueued on `stream` (the CUDA backend's; {} = the default stream); buffers are device
// pointers.
#pragma once

#include <memory>
#include <string>

#include <gloo/rendezvous/store.h>

#include "common/communicator.h"
#include "common/device_stream.h"

namespace dsmesh {

struct NcclLibrary;  // the dlopen'd entry points

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world, gloo::rendezvous::Store& store, DeviceStream stream);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void AllReduceSum(float* data, size_t n) override;
  void AllGather(const float* in, size_t n, float* out) override;
  void Broadcast(void* data, size_t bytes, int root) override;

  // Opens libnccl.so.2 (or $DSMESH_NCCL_LIBRARY); throws std::runtime_error with dlerror()'s text.
  static std::shared_ptr<NcclLibrary> Load();

 private:
  void Check(int result, const char* what) const;

  int rank_, world_;
  void* stream_;  // a cudaStream_t, as NCCL's entry points take it (nccl_abi.h)
  std::shared_ptr<NcclLibrary> lib_;
  void* comm_ = nullptr;  // ncclComm_t
};

}  // namespace dsmesh

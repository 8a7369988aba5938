// Communicator over Gloo's TCP transport for CPU workers. Peers find each other through a rendezvous
// store (the coordinator's, see grpc_store.h). Ring all-reduce gives bit-identical results on every rank,
// which keeps the replicated parts of the model (residual streams, router choices) identical.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <gloo/rendezvous/store.h>

#include "common/communicator.h"

namespace gloo {
class Context;
}

namespace dsmesh {

class GlooCommunicator final : public Communicator {
 public:
  // `host` is the address the other ranks reach this one at. Blocks until all ranks have connected.
  GlooCommunicator(int rank, int world, gloo::rendezvous::Store& store, const std::string& host,
                   std::chrono::milliseconds timeout);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void AllReduceSum(float* data, size_t n) override;
  void AllGather(const float* in, size_t n, float* out) override;
  void Broadcast(void* data, size_t bytes, int root) override;

 private:
  int rank_, world_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 0;
};

}  // namespace dsmesh

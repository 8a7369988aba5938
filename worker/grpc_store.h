// gloo::rendezvous::Store on top of the coordinator's WorkerControl.StoreSet/StoreGet, so Gloo (and the
// NCCL unique id) rendezvous needs nothing but the coordinator's address.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "proto/mesh.grpc.pb.h"

namespace dsmesh {

class GrpcStore : public gloo::rendezvous::Store {
 public:
  GrpcStore(std::shared_ptr<WorkerControl::Stub> stub, std::string prefix,
            std::chrono::milliseconds default_timeout = std::chrono::seconds(60));

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, default_timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<std::string> Fetch(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  std::shared_ptr<WorkerControl::Stub> stub_;
  std::string prefix_;
  std::chrono::milliseconds default_timeout_;
};

}  // namespace dsmesh

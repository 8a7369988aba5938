// The gateway's side of the Generate service (proto/mesh.proto): one channel to the coordinator,
// an asynchronous server-streaming call per request (gRPC callback API, no thread per request), and
// the Stats RPC used by /health, /metrics and admission.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "proto/mesh.grpc.pb.h"

namespace dsmesh {

// A running Generate call. Cancel() aborts it in the coordinator (which frees the request's KV);
// on_done still runs afterwards, with CANCELLED.
class GenerateCall {
 public:
  virtual ~GenerateCall() = default;
  virtual void Cancel() = 0;
};

class MeshClient {
 public:
  explicit MeshClient(const std::string& coordinator_address);

  // Callbacks run on gRPC threads, never concurrently for one call; on_message for each streamed
  // message, then on_done exactly once. Keep them short (no blocking).
  std::shared_ptr<GenerateCall> Generate(const GenerateRequest& request,
                                         std::function<void(const GenerateResponse&)> on_message,
                                         std::function<void(const grpc::Status&)> on_done);

  // Blocking Stats with a deadline; nullopt (and *error set) when the coordinator does not answer.
  std::optional<StatsResponse> Stats(std::chrono::milliseconds timeout, std::string* error = nullptr);

  const std::string& address() const { return address_; }

 private:
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Generate::Stub> stub_;
};

}  // namespace dsmesh

// The client of the coordinator's Generate service, for the gateway (asynchronous streams, Stats for
// /health, /metrics and admission), the CLI (`logits`/`generate` on a mesh, `bench`, `up`) and the tests
// (blocking Generate). One channel per client; every call carries the mesh credentials.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mesh/mesh_credentials.h"
#include "proto/mesh.grpc.pb.h"

namespace dsmesh {

// A running asynchronous Generate call. Cancel() aborts it in the coordinator (which frees the
// request's KV); on_done still runs afterwards, with CANCELLED.
class GenerateCall {
 public:
  virtual ~GenerateCall() = default;
  virtual void Cancel() = 0;
};

// What a blocking Generate returns.
struct GenerateResult {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::vector<LogitsRow> logits;   // return_logits only, in position order
  FinishReason finish = FINISH_NONE;
  std::string error;               // from the last message
  int32_t cached_prompt_tokens = 0;
  int32_t first_token_steps = 0;   // engine steps from arrival to the first token (coordinator's count)
  std::vector<double> token_times;  // seconds since the call, one per token
};

class MeshClient {
 public:
  explicit MeshClient(const std::string& address, const MeshCredentials& credentials = ProcessMeshCredentials());

  // Asynchronous: callbacks run on gRPC threads, never concurrently for one call; on_admitted once the
  // coordinator has admitted the request (its initial metadata, or else the first message, arrived; never
  // for a refused call), on_message for each streamed message, then on_done exactly once. Keep them
  // short (no blocking).
  std::shared_ptr<GenerateCall> Generate(const GenerateRequest& request,
                                         std::function<void(const GenerateResponse&)> on_message,
                                         std::function<void(const grpc::Status&)> on_done,
                                         std::function<void()> on_admitted = nullptr);
  // Blocking: the whole answer. Throws std::runtime_error with the gRPC status for a refused or broken call.
  GenerateResult Generate(const GenerateRequest& request);

  // Stats with a deadline. TryStats: nullopt (and *error set) when the coordinator does not answer;
  // Stats throws std::runtime_error instead.
  std::optional<StatsResponse> TryStats(std::chrono::milliseconds timeout, std::string* error = nullptr);
  StatsResponse Stats(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // Polls Stats until the mesh is ready; throws with the last not_ready_reason on timeout. `gone`, when
  // given, is asked between polls and returns why the mesh can no longer become ready (a child process of
  // a local mesh exited), or "": then WaitReady throws that at once instead of waiting out the timeout.
  void WaitReady(std::chrono::milliseconds timeout, const std::function<std::string()>& gone = nullptr);

  Generate::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }
  const MeshCredentials& credentials() const { return credentials_; }

 private:
  std::string address_;
  MeshCredentials credentials_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Generate::Stub> stub_;
};

}  // namespace dsmesh

// Client side of the Generate service, for the CLI (`logits`/`generate` on a mesh, `bench`) and the tests.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "proto/mesh.grpc.pb.h"

namespace dsmesh {

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
  explicit MeshClient(const std::string& address);
  // Throws std::runtime_error with the gRPC status for a refused or broken call.
  GenerateResult Generate(const GenerateRequest& req);
  StatsResponse Stats(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // Polls Stats until the mesh is ready; throws with the last not_ready_reason on timeout.
  void WaitReady(std::chrono::milliseconds timeout);
  Generate::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }

 private:
  std::string address_;
  std::unique_ptr<Generate::Stub> stub_;
};

}  // namespace dsmesh

#include "coordinator/mesh_client.h"

#include <stdexcept>
#include <thread>

#include <grpcpp/grpcpp.h>

namespace dsmesh {

MeshClient::MeshClient(const std::string& address) : address_(address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  // A coordinator that `dsmesh up` restarted is found again within a second (gRPC's default backoff
  // grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  stub_ = Generate::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

GenerateResult MeshClient::Generate(const GenerateRequest& req) {
  grpc::ClientContext ctx;
  auto t0 = std::chrono::steady_clock::now();
  auto reader = stub_->Generate(&ctx, req);
  GenerateResult out;
  GenerateResponse resp;
  while (reader->Read(&resp)) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int32_t tok : resp.token_ids()) {
      out.tokens.push_back(tok);
      out.token_times.push_back(t);
    }
    for (const auto& lp : resp.logprobs()) out.logprobs.push_back(lp);
    for (const auto& row : resp.logits()) out.logits.push_back(row);
    if (resp.cached_prompt_tokens()) out.cached_prompt_tokens = resp.cached_prompt_tokens();
    if (resp.first_token_steps()) out.first_token_steps = resp.first_token_steps();
    out.finish = resp.finish_reason();
    if (!resp.error().empty()) out.error = resp.error();
  }
  grpc::Status st = reader->Finish();
  if (!st.ok())
    throw std::runtime_error("Generate on " + address_ + " failed: " + std::to_string(st.error_code()) + " " +
                             st.error_message());
  return out;
}

StatsResponse MeshClient::Stats(std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  StatsRequest req;
  StatsResponse resp;
  grpc::Status st = stub_->Stats(&ctx, req, &resp);
  if (!st.ok()) throw std::runtime_error("Stats on " + address_ + " failed: " + st.error_message());
  return resp;
}

void MeshClient::WaitReady(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no answer";
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      StatsResponse s = Stats();
      if (s.ready()) return;
      last = s.not_ready_reason();
    } catch (const std::exception& e) {
      last = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw std::runtime_error("the mesh at " + address_ + " did not become ready: " + last);
}

}  // namespace dsmesh

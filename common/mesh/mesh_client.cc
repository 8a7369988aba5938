#include "common/mesh/mesh_client.h"

#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace dsmesh {

namespace {

class GenerateCallImpl : public GenerateCall, public grpc::ClientReadReactor<GenerateResponse> {
 public:
  GenerateCallImpl(const GenerateRequest& request, std::function<void(const GenerateResponse&)> on_message,
                   std::function<void(const grpc::Status&)> on_done, std::function<void()> on_admitted)
      : request_(request), on_message_(std::move(on_message)), on_done_(std::move(on_done)),
        on_admitted_(std::move(on_admitted)) {}

  void Start(Generate::Stub* stub, std::shared_ptr<GenerateCallImpl> self) {
    self_ = std::move(self);  // released in OnDone: the reactor must outlive the call
    stub->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  // TryCancel after the call completed would touch a released grpc_call: once OnDone has begun,
  // cancelling is a no-op.
  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) context_.TryCancel();
  }

  // ok is false for a trailers-only answer (the coordinator refused the call before admitting it).
  void OnReadInitialMetadataDone(bool ok) override {
    std::lock_guard<std::mutex> lock(callback_mu_);
    if (ok) Admitted();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // stream over; OnDone follows with the status
    {
      std::lock_guard<std::mutex> lock(callback_mu_);
      Admitted();  // a server that sends no initial metadata of its own admits with its first message
      on_message_(response_);
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    {
      std::lock_guard<std::mutex> lock(callback_mu_);
      on_done_(status);
    }
    on_message_ = nullptr;
    on_done_ = nullptr;
    on_admitted_ = nullptr;
    self_.reset();  // may delete this
  }

 private:
  grpc::ClientContext context_;
  GenerateRequest request_;
  GenerateResponse response_;
  std::function<void(const GenerateResponse&)> on_message_;
  std::function<void(const grpc::Status&)> on_done_;
  std::function<void()> on_admitted_;
  std::shared_ptr<GenerateCallImpl> self_;
  std::mutex mu_;
  bool done_ = false;
  std::mutex callback_mu_;  // the callbacks never run concurrently
  bool admitted_ = false;

  void Admitted() {  // callback_mu_ held
    if (admitted_) return;
    admitted_ = true;
    if (on_admitted_) on_admitted_();
  }
};

}  // namespace

MeshClient::MeshClient(const std::string& address, const MeshCredentials& credentials) : address_(address), credentials_(credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
  args.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  // A coordinator that restarted is found again within a second (gRPC's default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = MeshChannel(address, args, credentials);
  stub_ = Generate::NewStub(channel_);
}

std::shared_ptr<GenerateCall> MeshClient::Generate(const GenerateRequest& request,
                                                   std::function<void(const GenerateResponse&)> on_message,
                                                   std::function<void(const grpc::Status&)> on_done,
                                                   std::function<void()> on_admitted) {
  auto call = std::make_shared<GenerateCallImpl>(request, std::move(on_message), std::move(on_done),
                                                 std::move(on_admitted));
  call->Start(stub_.get(), call);
  return call;
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

std::optional<StatsResponse> MeshClient::TryStats(std::chrono::milliseconds timeout, std::string* error) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  StatsResponse response;
  grpc::Status status = stub_->Stats(&context, StatsRequest(), &response);
  if (!status.ok()) {
    if (error) *error = "coordinator " + address_ + ": " + status.error_message();
    return std::nullopt;
  }
  return response;
}

StatsResponse MeshClient::Stats(std::chrono::milliseconds timeout) {
  std::string error;
  auto s = TryStats(timeout, &error);
  if (!s) throw std::runtime_error("Stats failed: " + error);
  return *s;
}

void MeshClient::WaitReady(std::chrono::milliseconds timeout, const std::function<std::string()>& gone) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no answer";
  while (std::chrono::steady_clock::now() < deadline) {
    if (gone) {
      const std::string why = gone();
      if (!why.empty()) throw std::runtime_error("the mesh at " + address_ + " cannot become ready: " + why);
    }
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

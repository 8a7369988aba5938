#include "gateway/mesh_client.h"

#include <limits>
#include <mutex>

namespace dsmesh {

namespace {

class GenerateCallImpl : public GenerateCall, public grpc::ClientReadReactor<GenerateResponse> {
 public:
  GenerateCallImpl(const GenerateRequest& request, std::function<void(const GenerateResponse&)> on_message,
                   std::function<void(const grpc::Status&)> on_done)
      : request_(request), on_message_(std::move(on_message)), on_done_(std::move(on_done)) {}

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

  void OnReadDone(bool ok) override {
    if (!ok) return;  // stream over; OnDone follows with the status
    on_message_(response_);
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    on_done_(status);
    on_message_ = nullptr;
    on_done_ = nullptr;
    self_.reset();  // may delete this
  }

 private:
  grpc::ClientContext context_;
  GenerateRequest request_;
  GenerateResponse response_;
  std::function<void(const GenerateResponse&)> on_message_;
  std::function<void(const grpc::Status&)> on_done_;
  std::shared_ptr<GenerateCallImpl> self_;
  std::mutex mu_;
  bool done_ = false;
};

}  // namespace

MeshClient::MeshClient(const std::string& coordinator_address) : address_(coordinator_address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  // A restarted coordinator is found again within a second (gRPC's default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(coordinator_address, grpc::InsecureChannelCredentials(), args);
  stub_ = Generate::NewStub(channel_);
}

std::shared_ptr<GenerateCall> MeshClient::Generate(const GenerateRequest& request,
                                                   std::function<void(const GenerateResponse&)> on_message,
                                                   std::function<void(const grpc::Status&)> on_done) {
  auto call = std::make_shared<GenerateCallImpl>(request, std::move(on_message), std::move(on_done));
  call->Start(stub_.get(), call);
  return call;
}

std::optional<StatsResponse> MeshClient::Stats(std::chrono::milliseconds timeout, std::string* error) {
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

}  // namespace dsmesh

#include "worker/grpc_store.h"

#include <stdexcept>

#include <grpcpp/grpcpp.h>

namespace dsmesh {

GrpcStore::GrpcStore(std::shared_ptr<WorkerControl::Stub> stub, std::string prefix,
                     std::chrono::milliseconds default_timeout)
    : stub_(std::move(stub)), prefix_(std::move(prefix)), default_timeout_(default_timeout) {}

void GrpcStore::set(const std::string& key, const std::vector<char>& data) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  StoreSetRequest req;
  req.set_key(prefix_ + key);
  req.set_value(std::string(data.begin(), data.end()));
  StoreSetResponse resp;
  grpc::Status st = stub_->StoreSet(&ctx, req, &resp);
  if (!st.ok()) throw std::runtime_error("rendezvous store: set " + prefix_ + key + ": " + st.error_message());
}

std::vector<std::string> GrpcStore::Fetch(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout + std::chrono::seconds(5));
  StoreGetRequest req;
  for (const auto& k : keys) req.add_keys(prefix_ + k);
  req.set_timeout_ms(timeout.count());
  StoreGetResponse resp;
  grpc::Status st = stub_->StoreGet(&ctx, req, &resp);
  if (!st.ok()) throw std::runtime_error("rendezvous store: get: " + st.error_message());
  return {resp.values().begin(), resp.values().end()};
}

std::vector<char> GrpcStore::get(const std::string& key) {
  std::string v = Fetch({key}, default_timeout_).at(0);
  return {v.begin(), v.end()};
}

void GrpcStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  Fetch(keys, timeout);
}

}  // namespace dsmesh

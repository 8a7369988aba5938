#include "common/mesh/store_service.h"

#include <algorithm>

namespace dsmesh {

grpc::Status RendezvousStoreService::StoreSet(grpc::ServerContext* ctx, const StoreSetRequest* req, StoreSetResponse*) {
  if (auto st = Authorize(*ctx, "WorkerControl.StoreSet"); !st.ok()) return st;
  store_->Set(req->key(), req->value());
  return grpc::Status::OK;
}

grpc::Status RendezvousStoreService::StoreGet(grpc::ServerContext* ctx, const StoreGetRequest* req,
                                              StoreGetResponse* resp) {
  if (auto st = Authorize(*ctx, "WorkerControl.StoreGet"); !st.ok()) return st;
  try {
    auto values = store_->Get({req->keys().begin(), req->keys().end()},
                              std::chrono::milliseconds(std::max<int64_t>(req->timeout_ms(), 0)));
    for (auto& v : values) resp->add_values(std::move(v));
    return grpc::Status::OK;
  } catch (const std::exception& e) {
    return grpc::Status(grpc::DEADLINE_EXCEEDED, e.what());
  }
}

}  // namespace dsmesh

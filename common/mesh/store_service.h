// WorkerControl's StoreSet/StoreGet over a RendezvousStore: the coordinator's WorkerControl service
// derives from it (adding Session), and the collective tests and benchmarks serve it alone.
#pragma once

#include "common/mesh/mesh_token_check.h"
#include "common/mesh/rendezvous_store.h"
#include "proto/mesh.grpc.pb.h"

namespace dsmesh {

class RendezvousStoreService : public WorkerControl::Service {
 public:
  // `auth` may be null (no token required); both must outlive the service.
  RendezvousStoreService(RendezvousStore* store, const MeshTokenCheck* auth) : store_(store), auth_(auth) {}
  grpc::Status StoreSet(grpc::ServerContext* ctx, const StoreSetRequest* req, StoreSetResponse* resp) override;
  grpc::Status StoreGet(grpc::ServerContext* ctx, const StoreGetRequest* req, StoreGetResponse* resp) override;

 protected:
  grpc::Status Authorize(const grpc::ServerContext& ctx, const char* method) const {
    return auth_ ? auth_->Check(ctx, method) : grpc::Status::OK;
  }

 private:
  RendezvousStore* store_;
  const MeshTokenCheck* auth_;
};

}  // namespace dsmesh

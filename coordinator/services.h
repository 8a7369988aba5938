// The coordinator's two gRPC services: Generate (gateways, CLI) and WorkerControl (workers). Every
// method first checks the caller's mesh token (common/mesh/mesh_token_check.h).
#pragma once

#include "common/mesh/mesh_token_check.h"
#include "common/mesh/rendezvous_store.h"
#include "common/mesh/store_service.h"
#include "coordinator/engine.h"
#include "coordinator/worker_mesh.h"
#include "proto/mesh.grpc.pb.h"

namespace dsmesh {

class GenerateService final : public Generate::Service {
 public:
  // `auth` may be null (no token required).
  GenerateService(Engine* engine, const MeshTokenCheck* auth) : engine_(engine), auth_(auth) {}
  // Streams one response per step that produced tokens; the client closing the stream cancels the request
  // (its sequence is freed in the next step). A failed request ends with finish_reason FINISH_ABORT and
  // `error` set on the last message, and status OK; a request refused at admission gets INVALID_ARGUMENT
  // (bad parameters, context overflow), UNAVAILABLE (not ready, draining) or RESOURCE_EXHAUSTED (more
  // than max_num_seqs + --max-queued requests running or waiting, over all gateways) and no message; an
  // admitted one gets its initial metadata at once.
  grpc::Status Generate(grpc::ServerContext* ctx, const GenerateRequest* req,
                        grpc::ServerWriter<GenerateResponse>* writer) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const StatsRequest* req, StatsResponse* resp) override;

 private:
  grpc::Status Authorize(const grpc::ServerContext& ctx, const char* method) const {
    return auth_ ? auth_->Check(ctx, method) : grpc::Status::OK;
  }
  Engine* engine_;
  const MeshTokenCheck* auth_;
};

// StoreSet/StoreGet come from RendezvousStoreService; Session is the worker's step stream.
class WorkerControlService final : public RendezvousStoreService {
 public:
  WorkerControlService(WorkerMesh* mesh, RendezvousStore* store, const MeshTokenCheck* auth)
      : RendezvousStoreService(store, auth), mesh_(mesh) {}
  grpc::Status Session(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<CoordinatorMessage, WorkerMessage>* stream) override;

 private:
  WorkerMesh* mesh_;
};

}  // namespace dsmesh

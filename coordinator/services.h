// The coordinator's two gRPC services: Generate (gateways, CLI) and WorkerControl (workers).
#pragma once

#include "coordinator/engine.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/worker_mesh.h"
#include "proto/mesh.grpc.pb.h"

namespace dsmesh {

class GenerateService final : public Generate::Service {
 public:
  explicit GenerateService(Engine* engine) : engine_(engine) {}
  // Streams one response per step that produced tokens; the client closing the stream cancels the request
  // (its sequence is freed in the next step). A failed request ends with finish_reason FINISH_ABORT and
  // `error` set on the last message, and status OK; a request refused at admission gets INVALID_ARGUMENT
  // (bad parameters, context overflow) or UNAVAILABLE (not ready, draining) and no message.
  grpc::Status Generate(grpc::ServerContext* ctx, const GenerateRequest* req,
                        grpc::ServerWriter<GenerateResponse>* writer) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const StatsRequest* req, StatsResponse* resp) override;

 private:
  Engine* engine_;
};

class WorkerControlService final : public WorkerControl::Service {
 public:
  WorkerControlService(WorkerMesh* mesh, RendezvousStore* store) : mesh_(mesh), store_(store) {}
  grpc::Status Session(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<CoordinatorMessage, WorkerMessage>* stream) override;
  grpc::Status StoreSet(grpc::ServerContext* ctx, const StoreSetRequest* req, StoreSetResponse* resp) override;
  grpc::Status StoreGet(grpc::ServerContext* ctx, const StoreGetRequest* req, StoreGetResponse* resp) override;

 private:
  WorkerMesh* mesh_;
  RendezvousStore* store_;
};

}  // namespace dsmesh

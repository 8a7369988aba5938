#include "coordinator/services.h"

namespace dsmesh {

grpc::Status GenerateService::Generate(grpc::ServerContext* ctx, const GenerateRequest* req,
                                       grpc::ServerWriter<GenerateResponse>* writer) {
  std::shared_ptr<Request> r;
  try {
    r = engine_->Submit(*req);
  } catch (const Unavailable& e) {
    return grpc::Status(grpc::UNAVAILABLE, e.what());
  } catch (const std::invalid_argument& e) {
    return grpc::Status(grpc::INVALID_ARGUMENT, e.what());
  }
  GenerateResponse resp;
  while (true) {
    if (ctx->IsCancelled()) {
      r->cancelled = true;
      engine_->Wake();
      return grpc::Status(grpc::CANCELLED, "client cancelled");
    }
    if (!r->out->Pop(&resp, std::chrono::milliseconds(10))) continue;
    const bool last = resp.finish_reason() != FINISH_NONE;
    if (!writer->Write(resp)) {
      r->cancelled = true;
      engine_->Wake();
      return grpc::Status(grpc::CANCELLED, "client went away");
    }
    if (last) return grpc::Status::OK;
  }
}

grpc::Status GenerateService::Stats(grpc::ServerContext*, const StatsRequest*, StatsResponse* resp) {
  *resp = engine_->Stats();
  return grpc::Status::OK;
}

grpc::Status WorkerControlService::Session(grpc::ServerContext* ctx,
                                           grpc::ServerReaderWriter<CoordinatorMessage, WorkerMessage>* stream) {
  return mesh_->Serve(ctx, stream);
}

grpc::Status WorkerControlService::StoreSet(grpc::ServerContext*, const StoreSetRequest* req, StoreSetResponse*) {
  store_->Set(req->key(), req->value());
  return grpc::Status::OK;
}

grpc::Status WorkerControlService::StoreGet(grpc::ServerContext*, const StoreGetRequest* req, StoreGetResponse* resp) {
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

#include "coordinator/services.h"

namespace dsmesh {

grpc::Status GenerateService::Generate(grpc::ServerContext* ctx, const GenerateRequest* req,
                                       grpc::ServerWriter<GenerateResponse>* writer) {
  if (auto st = Authorize(*ctx, "Generate.Generate"); !st.ok()) return st;
  std::shared_ptr<Request> r;
  try {
    r = engine_->Submit(*req);
  } catch (const Unavailable& e) {
    return grpc::Status(grpc::UNAVAILABLE, e.what());
  } catch (const QueueFull& e) {
    return grpc::Status(grpc::RESOURCE_EXHAUSTED, e.what());
  } catch (const std::invalid_argument& e) {
    return grpc::Status(grpc::INVALID_ARGUMENT, e.what());
  }
  // Admitted: the initial metadata tells the client so before the first token (a gateway answers its
  // streaming client's 200 only then; a refusal above is a trailers-only 429/503/400).
  writer->SendInitialMetadata();
  GenerateResponse resp;
  while (true) {
    if (ctx->IsCancelled()) {
      engine_->Cancel(r);
      return grpc::Status(grpc::CANCELLED, "client cancelled");
    }
    if (!r->out->Pop(&resp, std::chrono::milliseconds(10))) continue;
    const bool last = resp.finish_reason() != FINISH_NONE;
    if (!writer->Write(resp)) {
      engine_->Cancel(r);
      return grpc::Status(grpc::CANCELLED, "client went away");
    }
    if (last) return grpc::Status::OK;
  }
}

grpc::Status GenerateService::Stats(grpc::ServerContext* ctx, const StatsRequest*, StatsResponse* resp) {
  if (auto st = Authorize(*ctx, "Generate.Stats"); !st.ok()) return st;
  *resp = engine_->Stats();
  return grpc::Status::OK;
}

grpc::Status WorkerControlService::Session(grpc::ServerContext* ctx,
                                           grpc::ServerReaderWriter<CoordinatorMessage, WorkerMessage>* stream) {
  if (auto st = Authorize(*ctx, "WorkerControl.Session"); !st.ok()) return st;
  return mesh_->Serve(ctx, stream);
}

}  // namespace dsmesh

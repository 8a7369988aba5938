#include "common/mesh/mesh_token_check.h"

#include <chrono>
#include <cstdio>

#include "common/constant_time.h"
#include "common/mesh/mesh_credentials.h"

namespace dsmesh {

grpc::Status MeshTokenCheck::Check(const grpc::ServerContext& ctx, const char* method) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& md = ctx.client_metadata();
  const auto it = md.find(kMeshTokenMetadataKey);
  const char* why = "no mesh token";
  if (it != md.end()) {
    if (ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()), token_)) return grpc::Status::OK;
    why = "wrong mesh token";
  }
  const int64_t n = ++refused_;
  // One line per refusal, at most one a second (a peer retrying in a loop does not flood the log).
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t last = last_log_ns_.load();
  if (now - last >= 1'000'000'000 && last_log_ns_.compare_exchange_strong(last, now))
    std::fprintf(stderr, "[coordinator] refused %s from %s: %s (UNAUTHENTICATED; %lld refused so far)\n", method,
                 ctx.peer().c_str(), why, static_cast<long long>(n));
  return grpc::Status(grpc::UNAUTHENTICATED, std::string(why) + ": this mesh requires --mesh-token-file (or " +
                                                 kMeshTokenFileEnv + ") with the coordinator's token");
}

}  // namespace dsmesh

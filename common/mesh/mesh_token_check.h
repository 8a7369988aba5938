// The coordinator's check of the mesh token on every incoming call (each service method calls Check
// first): a call without the right token gets UNAUTHENTICATED and one log line naming the peer.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <string>

namespace dsmesh {

class MeshTokenCheck {
 public:
  // An empty token lets every peer in (a mesh without a token, loopback only).
  explicit MeshTokenCheck(std::string token) : token_(std::move(token)) {}

  // OK, or UNAUTHENTICATED for a missing or wrong token (compared in constant time).
  grpc::Status Check(const grpc::ServerContext& ctx, const char* method) const;
  bool required() const { return !token_.empty(); }
  int64_t refused() const { return refused_.load(); }

 private:
  const std::string token_;
  mutable std::atomic<int64_t> refused_{0};
  mutable std::atomic<int64_t> last_log_ns_{0};
};

}  // namespace dsmesh

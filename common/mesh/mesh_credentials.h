// The credentials of the mesh's gRPC links (gateway, worker and CLI to the coordinator): a shared mesh
// token sent as call metadata on every call, and optionally TLS with client certificates (gRPC's own
// SSL credentials). Every binary takes the same flags:
//   --mesh-token-file F   (or DSMESH_MESH_TOKEN_FILE)  the token: the file's first line, mode 0600
//   --tls-cert F --tls-key F --tls-ca F  (or DSMESH_TLS_CERT/KEY/CA)  PEM files; all three or none. The
//                         coordinator requires and verifies client certificates signed by the CA; its
//                         own certificate must name the address the others dial.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/flags.h"

namespace dsmesh {

inline constexpr char kMeshTokenMetadataKey[] = "x-dsmesh-mesh-token";
inline constexpr char kMeshTokenFileEnv[] = "DSMESH_MESH_TOKEN_FILE";

struct MeshCredentials {
  std::string token;       // empty: none is sent (client) / none is required (coordinator)
  std::string token_file;  // where the token came from; handed on to child processes
  std::string tls_cert, tls_key, tls_ca;  // PEM file paths; empty: plaintext links
  bool tls() const { return !tls_cert.empty(); }
};

// `known` plus mesh-token-file, tls-cert, tls-key, tls-ca.
std::set<std::string> WithMeshCredentialFlags(std::set<std::string> known);

// The credentials the flags (else the environment) name. Throws UsageError for an unreadable or empty
// token file, or TLS files given only in part.
MeshCredentials MeshCredentialsFromFlags(const Flags& f);

// The token in `path` (its first line, surrounding whitespace dropped). Throws UsageError naming the file.
std::string ReadMeshTokenFile(const std::string& path);

// A fresh random token: 32 bytes from /dev/urandom, in hex.
std::string RandomMeshToken();
// Writes `token` to `path` (replacing any file there) with mode 0600.
void WriteMeshTokenFile(const std::string& path, const std::string& token);

// The flags that hand `c` to a child process: --mesh-token-file F, --tls-cert F ... (none for empty ones).
std::vector<std::string> MeshCredentialArgs(const MeshCredentials& c);

// This process's credentials: what main() loaded, or what a local mesh generated. MeshClient uses them
// unless it is given others.
MeshCredentials ProcessMeshCredentials();
void SetProcessMeshCredentials(MeshCredentials c);

// A channel to the coordinator whose every call carries the token (and that speaks TLS when configured).
std::shared_ptr<grpc::Channel> MeshChannel(const std::string& address, const grpc::ChannelArguments& args,
                                           const MeshCredentials& c);

// The coordinator's listening credentials: TLS requiring client certificates when configured, else plaintext.
std::shared_ptr<grpc::ServerCredentials> MeshServerCredentials(const MeshCredentials& c);

}  // namespace dsmesh

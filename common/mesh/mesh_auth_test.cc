// The mesh token end to end over a real gRPC server (the rendezvous store service, which checks it
// like every coordinator method): no token or a wrong one gets UNAUTHENTICATED, the right one is served.
// TLS (--tls-cert/--tls-key/--tls-ca, the same MeshChannel / MeshServerCredentials every binary uses)
// with throwaway certificates made by Debian's openssl: a peer with a certificate from the mesh's CA is
// served; a plaintext peer, a TLS peer without a client certificate and one whose certificate another
// CA signed are refused.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/mesh/mesh_credentials.h"
#include "common/mesh/store_service.h"

namespace dsmesh {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

class AuthServer {
 public:
  explicit AuthServer(const std::string& token, const MeshCredentials& server_credentials = {})
      : auth_(token), service_(&store_, &auth_) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", MeshServerCredentials(server_credentials), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
  }
  ~AuthServer() { server_->Shutdown(); }
  grpc::Status Set(const MeshCredentials& c) {
    return SetOver(MeshChannel("127.0.0.1:" + std::to_string(port_), grpc::ChannelArguments(), c));
  }
  grpc::Status SetOver(std::shared_ptr<grpc::Channel> channel) {
    auto stub = WorkerControl::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    StoreSetRequest req;
    req.set_key("k");
    req.set_value("v");
    StoreSetResponse resp;
    return stub->StoreSet(&ctx, req, &resp);
  }
  const MeshTokenCheck& auth() const { return auth_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  RendezvousStore store_;
  MeshTokenCheck auth_;
  RendezvousStoreService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(MeshAuth, PeerWithoutTheTokenIsRefused) {
  AuthServer server("s3cret-token");
  const grpc::Status none = server.Set({});
  EXPECT_EQ(none.error_code(), grpc::UNAUTHENTICATED) << none.error_message();
  EXPECT_NE(none.error_message().find("no mesh token"), std::string::npos) << none.error_message();
  MeshCredentials wrong;
  wrong.token = "s3cret-tokem";
  const grpc::Status bad = server.Set(wrong);
  EXPECT_EQ(bad.error_code(), grpc::UNAUTHENTICATED);
  EXPECT_NE(bad.error_message().find("wrong mesh token"), std::string::npos) << bad.error_message();
  EXPECT_EQ(server.auth().refused(), 2);
  MeshCredentials right;
  right.token = "s3cret-token";
  EXPECT_TRUE(server.Set(right).ok());
  EXPECT_EQ(server.auth().refused(), 2);
}

TEST(MeshAuth, WithoutATokenEveryPeerIsServed) {
  AuthServer server("");
  EXPECT_TRUE(server.Set({}).ok());
}

TEST(MeshAuth, TokenFileIsPrivateAndReadBack) {
  const std::string path = TempPath("mesh-token");
  const std::string token = RandomMeshToken();
  EXPECT_EQ(token.size(), 64u);
  EXPECT_NE(token, RandomMeshToken());
  WriteMeshTokenFile(path, token);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(ReadMeshTokenFile(path), token);
  {
    std::ofstream(TempPath("empty-token")) << "  \n";
  }
  EXPECT_THROW(ReadMeshTokenFile(TempPath("empty-token")), UsageError);
  EXPECT_THROW(ReadMeshTokenFile(TempPath("no-such-file")), UsageError);
}

TEST(MeshAuth, FlagsThenEnvironmentNameTheTokenFile) {
  const std::string a = TempPath("token-a"), b = TempPath("token-b");
  WriteMeshTokenFile(a, "aaa");
  WriteMeshTokenFile(b, "bbb");
  const auto known = WithMeshCredentialFlags({});
  setenv(kMeshTokenFileEnv, b.c_str(), 1);
  EXPECT_EQ(MeshCredentialsFromFlags(Flags({"--mesh-token-file", a}, known)).token, "aaa");
  EXPECT_EQ(MeshCredentialsFromFlags(Flags({}, known)).token, "bbb");
  EXPECT_EQ(MeshCredentialArgs(MeshCredentialsFromFlags(Flags({}, known))),
            (std::vector<std::string>{"--mesh-token-file", b}));
  unsetenv(kMeshTokenFileEnv);
  EXPECT_EQ(MeshCredentialsFromFlags(Flags({}, known)).token, "");
  EXPECT_THROW(MeshCredentialsFromFlags(Flags({"--tls-cert", a}, known)), UsageError);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A CA, a coordinator certificate for 127.0.0.1 and a client certificate signed by it; a second CA and
// a client certificate signed by that one. Returns the directory.
std::string MakeCertificates() {
  const std::string dir = TempPath("tls");
  const std::string script = "set -e; rm -rf " + dir + "; mkdir -p " + dir + "; cd " + dir + R"(;
    ca() { openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=$1" -keyout $1.key -out $1.crt 2>/dev/null; }
    leaf() { openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout $1.key -out $1.csr 2>/dev/null
             printf 'subjectAltName=IP:127.0.0.1,DNS:localhost
' > $1.ext
             openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial -days 1 -extfile $1.ext -out $1.crt 2>/dev/null; }
    ca mesh-ca; ca rogue-ca
    leaf coordinator mesh-ca; leaf worker mesh-ca; leaf stranger rogue-ca)";
  if (std::system(script.c_str()) != 0) return "";
  return dir;
}

MeshCredentials Tls(const std::string& dir, const std::string& leaf, const std::string& ca = "mesh-ca") {
  MeshCredentials c;
  c.tls_cert = dir + "/" + leaf + ".crt";
  c.tls_key = dir + "/" + leaf + ".key";
  c.tls_ca = dir + "/" + ca + ".crt";
  return c;
}

TEST(MeshAuth, TlsWithClientCertificates) {
  const std::string dir = MakeCertificates();
  ASSERT_FALSE(dir.empty()) << "openssl failed (Debian's openssl package is one of ./dsmesh's packages)";
  MeshCredentials server_side = Tls(dir, "coordinator");
  server_side.token = "tok";
  AuthServer server("tok", server_side);

  MeshCredentials worker = Tls(dir, "worker");
  worker.token = "tok";
  const grpc::Status ok = server.Set(worker);
  EXPECT_TRUE(ok.ok()) << ok.error_message();

  // TLS alone does not replace the token: a mesh certificate without it is still refused.
  EXPECT_EQ(server.Set(Tls(dir, "worker")).error_code(), grpc::UNAUTHENTICATED);

  MeshCredentials plaintext;
  plaintext.token = "tok";
  const grpc::Status plain = server.Set(plaintext);
  EXPECT_EQ(plain.error_code(), grpc::UNAVAILABLE) << plain.error_message();

  grpc::SslCredentialsOptions no_cert;  // trusts the mesh CA, shows no certificate of its own
  no_cert.pem_root_certs = ReadFile(dir + "/mesh-ca.crt");
  const grpc::Status anonymous =
      server.SetOver(grpc::CreateChannel(server.address(), grpc::SslCredentials(no_cert)));
  EXPECT_EQ(anonymous.error_code(), grpc::UNAVAILABLE) << anonymous.error_message();

  MeshCredentials stranger = Tls(dir, "stranger");  // its certificate from another CA, trusting ours
  stranger.token = "tok";
  const grpc::Status foreign = server.Set(stranger);
  EXPECT_EQ(foreign.error_code(), grpc::UNAVAILABLE) << foreign.error_message();

  MeshCredentials wrong_trust = Tls(dir, "worker", "rogue-ca");  // does not trust the coordinator
  wrong_trust.token = "tok";
  EXPECT_EQ(server.Set(wrong_trust).error_code(), grpc::UNAVAILABLE);

  // The flags carry all three files to children unchanged.
  EXPECT_EQ(MeshCredentialArgs(Tls(dir, "worker")),
            (std::vector<std::string>{"--tls-cert", dir + "/worker.crt", "--tls-key", dir + "/worker.key", "--tls-ca",
                                      dir + "/mesh-ca.crt"}));
}

}  // namespace
}  // namespace dsmesh

// The mesh token end to end over a real gRPC server (the rendezvous store service, which checks it
// like every coordinator method): no token or a wrong one gets UNAUTHENTICATED, the right one is served.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

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
  explicit AuthServer(const std::string& token) : auth_(token), service_(&store_, &auth_) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", MeshServerCredentials({}), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
  }
  ~AuthServer() { server_->Shutdown(); }
  grpc::Status Set(const MeshCredentials& c) {
    auto stub = WorkerControl::NewStub(MeshChannel("127.0.0.1:" + std::to_string(port_), grpc::ChannelArguments(), c));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    StoreSetRequest req;
    req.set_key("k");
    req.set_value("v");
    StoreSetResponse resp;
    return stub->StoreSet(&ctx, req, &resp);
  }
  const MeshTokenCheck& auth() const { return auth_; }

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

}  // namespace
}  // namespace dsmesh

// The mesh's links are authenticated: a peer without the mesh token (a raw gRPC client, a worker started
// without --mesh-token-file) is refused with UNAUTHENTICATED and the coordinator logs who it refused,
// while the mesh's own clients are served.
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "tests/mesh/mesh_fixture.h"

namespace dsmesh::mesh_test {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(MeshAuth, PeersWithoutTheTokenAreRefused) {
  LocalMeshOptions o = MeshOptions(1);
  o.log_dir = TempDir("auth_logs");
  LocalMesh mesh(o);
  mesh.Start();
  ASSERT_FALSE(mesh.credentials().token.empty());
  MeshClient client(mesh.coordinator_address(), mesh.credentials());
  client.WaitReady(std::chrono::seconds(60));

  // A raw gRPC client: both services refuse it.
  auto channel = grpc::CreateChannel(mesh.coordinator_address(), grpc::InsecureChannelCredentials());
  {
    grpc::ClientContext ctx;
    StatsResponse resp;
    const grpc::Status st = Generate::NewStub(channel)->Stats(&ctx, StatsRequest(), &resp);
    EXPECT_EQ(st.error_code(), grpc::UNAUTHENTICATED) << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    auto reader = Generate::NewStub(channel)->Generate(&ctx, Greedy(Tokens(8, 3), 2));
    GenerateResponse resp;
    EXPECT_FALSE(reader->Read(&resp));
    EXPECT_EQ(reader->Finish().error_code(), grpc::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    StoreGetRequest req;
    req.add_keys("anything");
    StoreGetResponse resp;
    EXPECT_EQ(WorkerControl::NewStub(channel)->StoreGet(&ctx, req, &resp).error_code(), grpc::UNAUTHENTICATED);
  }
  {  // a wrong token
    grpc::ClientContext ctx;
    ctx.AddMetadata(kMeshTokenMetadataKey, mesh.credentials().token + "x");
    StatsResponse resp;
    EXPECT_EQ(Generate::NewStub(channel)->Stats(&ctx, StatsRequest(), &resp).error_code(), grpc::UNAUTHENTICATED);
  }

  // A worker started without the token cannot register: it exits and says why.
  const std::string log = TempDir("auth_stranger") + "/worker.log";
  const pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(log.c_str(), "w", stderr)) _exit(126);
    unsetenv(kMeshTokenFileEnv);
    const std::string bin = o.worker_bin, address = mesh.coordinator_address();
    execl(bin.c_str(), bin.c_str(), "--rank", "0", "--world", "1", "--coordinator", address.c_str(), "--model",
          o.model_dir.c_str(), "--kv-memory", "64M", (char*)nullptr);
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(ReadAll(log).find("refused this worker (UNAUTHENTICATED)"), std::string::npos) << ReadAll(log);

  // The coordinator names what it refused and from where (at most one line a second).
  const std::string coordinator_log = mesh.log_path("coordinator");
  EXPECT_NE(ReadAll(coordinator_log).find("[coordinator] refused "), std::string::npos) << ReadAll(coordinator_log);
  EXPECT_NE(ReadAll(coordinator_log).find("UNAUTHENTICATED"), std::string::npos);
  // The token itself never appears in a log.
  EXPECT_EQ(ReadAll(coordinator_log).find(mesh.credentials().token), std::string::npos);

  // The mesh's own client is still served, and the real worker is still its rank 0.
  Reference reference;
  const auto prompt = Tokens(10, 5);
  EXPECT_EQ(client.Generate(Greedy(prompt, 3)).tokens, reference.Greedy(prompt, 3));
  EXPECT_EQ(client.Stats().mesh_epoch(), 1);
}

}  // namespace
}  // namespace dsmesh::mesh_test

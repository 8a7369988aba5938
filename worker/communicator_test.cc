// Gloo collectives among threads that rendezvous through the coordinator's store service over gRPC,
// and NCCL's load failure on a machine without libnccl.
#include <cstdlib>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/mesh/store_service.h"
#include "worker/gloo_communicator.h"
#include "worker/grpc_store.h"
#include "worker/nccl_communicator.h"

namespace dsmesh {
namespace {

class StoreServer {
 public:
  StoreServer() : service_(&store_, nullptr) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
  }
  ~StoreServer() { server_->Shutdown(); }
  std::shared_ptr<WorkerControl::Stub> Stub() {
    return WorkerControl::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
  }

 private:
  RendezvousStore store_;
  RendezvousStoreService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

void RunGloo(int world) {
  StoreServer server;
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        GrpcStore store(server.Stub(), "test/");
        GlooCommunicator comm(rank, world, store, "127.0.0.1", std::chrono::seconds(20));
        // All-reduce: rank r contributes r + i at index i.
        std::vector<float> x(1000);
        for (int i = 0; i < 1000; ++i) x[i] = rank + i * 0.5f;
        comm.AllReduceSum(x.data(), x.size());
        for (int i = 0; i < 1000; ++i) {
          float want = world * (world - 1) / 2.0f + world * i * 0.5f;
          if (x[i] != want) throw std::runtime_error("allreduce mismatch at " + std::to_string(i));
        }
        std::vector<float> mine = {float(rank), float(10 * rank)}, all(2 * world);
        comm.AllGather(mine.data(), 2, all.data());
        for (int r = 0; r < world; ++r)
          if (all[2 * r] != r || all[2 * r + 1] != 10 * r) throw std::runtime_error("allgather mismatch");
        int64_t v = rank == 1 % world ? 123456789 : -1;
        comm.Broadcast(&v, sizeof(v), 1 % world);
        if (v != 123456789) throw std::runtime_error("broadcast mismatch");
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

TEST(GlooCommunicator, CollectivesAtWorld2) { RunGloo(2); }
TEST(GlooCommunicator, CollectivesAtWorld4) { RunGloo(4); }

TEST(GrpcStore, MissingKeyTimesOutNamingIt) {
  StoreServer server;
  GrpcStore store(server.Stub(), "p/");
  try {
    store.wait({"never"}, std::chrono::milliseconds(200));
    FAIL() << "wait returned";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("p/never"), std::string::npos) << e.what();
  }
}

TEST(NcclCommunicator, MissingLibraryFailsLoudly) {
  setenv("DSMESH_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  try {
    NcclCommunicator::Load();
    FAIL() << "loaded a library that does not exist";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libnccl.so.2"), std::string::npos) << e.what();
  }
  unsetenv("DSMESH_NCCL_LIBRARY");
}

}  // namespace
}  // namespace dsmesh

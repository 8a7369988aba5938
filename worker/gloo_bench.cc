// Gloo all-reduce latency among threads of this process (rendezvous through an in-process rendezvous
// store over gRPC, TCP on loopback), to tell the transport's own cost apart from the mesh's.
//   bazel run //worker:gloo_bench -- [world=2] [floats=128] [iterations=2000]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/mesh/store_service.h"
#include "worker/gloo_communicator.h"
#include "worker/grpc_store.h"

int main(int argc, char** argv) {
  using namespace dsmesh;
  const int world = argc > 1 ? std::atoi(argv[1]) : 2;
  const size_t n = argc > 2 ? std::atol(argv[2]) : 128;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 2000;
  RendezvousStore store;
  RendezvousStoreService service(&store, nullptr);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  std::vector<double> us(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto stub = WorkerControl::NewStub(
          grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
      GrpcStore s(std::move(stub), "bench/");
      GlooCommunicator comm(r, world, s, "127.0.0.1", std::chrono::seconds(30));
      std::vector<float> x(n, 1.0f);
      for (int i = 0; i < 50; ++i) comm.AllReduceSum(x.data(), n);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) comm.AllReduceSum(x.data(), n);
      us[r] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    });
  for (auto& t : threads) t.join();
  std::printf("gloo all-reduce, world %d, %zu floats: %.1f us per call (rank 0)\n", world, n, us[0]);
  server->Shutdown();
  return 0;
}

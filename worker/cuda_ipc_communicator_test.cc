// CudaIpcCommunicator with real processes on one GPU: the test binary runs itself once per rank (CUDA
// cannot be used in a child forked after the parent touched it), the ranks meet through a gloo FileStore
// in a fresh directory, and each rank checks its own results against sums computed on the host in rank
// order, bitwise. A rank that leaves early must make the others fail with the timeout, not hang.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/file_store.h>
#include <gtest/gtest.h>

#include "kernels/cuda/gpu_test_util.h"
#include "worker/cuda_ipc_communicator.h"

extern char** environ;

namespace dsmesh {
namespace {

constexpr size_t kCapacity = 1000;  // floats per staging half: the larger collectives run in chunks

float Value(int rank, size_t i, int salt) {
  return std::sin(0.37f * static_cast<float>(i) + 1.3f * rank + 0.11f * salt) * (1.0f + rank);
}

std::vector<float> Values(int rank, size_t n, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Value(rank, i, salt);
  return v;
}

// The host's rank-ordered fp32 sum of exactly the vectors the ranks send (built by Values, not
// recomputed inline: a vectorised sinf may round differently): what every rank must get, bit for bit.
std::vector<float> ExpectedSum(int world, size_t n, int salt) {
  std::vector<float> s = Values(0, n, salt);
  for (int r = 1; r < world; ++r) {
    const std::vector<float> v = Values(r, n, salt);
    for (size_t i = 0; i < n; ++i) s[i] += v[i];
  }
  return s;
}

int failures = 0;
void Expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "rank check failed: %s\n", what.c_str());
    ++failures;
  }
}

void ExpectBitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  if (got.size() != want.size()) return Expect(false, what + ": size " + std::to_string(got.size()));
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return Expect(false, what + ": first difference at " + std::to_string(i) + ": " + std::to_string(got[i]) +
                               " vs " + std::to_string(want[i]));
}

// One rank of scenario "collectives": every collective on device and host buffers, sizes below, at and
// above the staging capacity, then 200 back to back (the double buffering under pressure).
void Collectives(CudaIpcCommunicator& comm) {
  const int rank = comm.rank(), world = comm.world();
  int salt = 0;
  for (size_t n : {size_t{1}, size_t{999}, kCapacity, size_t{2500}}) {
    ++salt;
    testing::DeviceBuffer<float> d(Values(rank, n, salt));
    comm.AllReduceSum(d.get(), n);
    ExpectBitwise(d.Download(), ExpectedSum(world, n, salt), "device AllReduceSum n=" + std::to_string(n));
    std::vector<float> h = Values(rank, n, salt);
    comm.AllReduceSum(h.data(), n);
    ExpectBitwise(h, ExpectedSum(world, n, salt), "host AllReduceSum n=" + std::to_string(n));

    std::vector<float> want_gather;
    for (int r = 0; r < world; ++r) {
      auto v = Values(r, n, salt);
      want_gather.insert(want_gather.end(), v.begin(), v.end());
    }
    testing::DeviceBuffer<float> in(Values(rank, n, salt)), out(world * n);
    comm.AllGather(in.get(), n, out.get());
    ExpectBitwise(out.Download(), want_gather, "device AllGather n=" + std::to_string(n));
    std::vector<float> hin = Values(rank, n, salt), hout(world * n);
    comm.AllGather(hin.data(), n, hout.data());
    ExpectBitwise(hout, want_gather, "host AllGather n=" + std::to_string(n));

    for (int root = 0; root < world; ++root) {
      testing::DeviceBuffer<float> b(rank == root ? Values(root, n, salt) : std::vector<float>(n, -1.0f));
      comm.Broadcast(b.get(), n * sizeof(float), root);
      ExpectBitwise(b.Download(), Values(root, n, salt),
                    "Broadcast n=" + std::to_string(n) + " root " + std::to_string(root));
    }
  }
  for (int k = 0; k < 200; ++k) {
    const size_t n = (k % 3 == 0) ? 1500 : 64 + k;
    testing::DeviceBuffer<float> d(Values(rank, n, 100 + k));
    comm.AllReduceSum(d.get(), n);
    ExpectBitwise(d.Download(), ExpectedSum(world, n, 100 + k), "back-to-back AllReduceSum " + std::to_string(k));
  }
}

// A rank's life, in its own process: DSMESH_IPC_CHILD="SCENARIO RANK WORLD STORE_DIR".
int RunRank(const std::string& spec) {
  char scenario[32];
  int rank = 0, world = 0;
  char dir[4096];
  if (std::sscanf(spec.c_str(), "%31s %d %d %4095s", scenario, &rank, &world, dir) != 4) return 2;
  gloo::rendezvous::FileStore store(dir);
  try {
    CudaIpcCommunicator comm(rank, world, store, 0, std::chrono::milliseconds(2000), kCapacity);
    if (std::string(scenario) == "collectives") {
      Collectives(comm);
      std::printf("rank %d/%d: %lld collectives, %lld bytes staged, %d failures\n", rank, world,
                  static_cast<long long>(comm.collectives()), static_cast<long long>(comm.bytes_staged()), failures);
      return failures == 0 ? 0 : 1;
    }
    // "peer-dies": the last rank leaves right after joining; the others must time out.
    if (rank == world - 1) _exit(0);
    std::vector<float> h(10, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm.AllReduceSum(h.data(), h.size());
    } catch (const std::exception& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("rank %d: %s (after %.1f s)\n", rank, e.what(), s);
      return std::string(e.what()).find("timed out") != std::string::npos && s < 10 ? 0 : 1;
    }
    std::fprintf(stderr, "rank %d: AllReduceSum returned though a peer had left\n", rank);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
}

// Runs `world` ranks of `scenario` as processes of this binary; true when all exit 0 within 120 s.
bool RunRanks(const std::string& scenario, int world) {
  char tmpl[] = "/tmp/dsmesh-ipc-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const std::string env = "DSMESH_IPC_CHILD=" + scenario + " " + std::to_string(r) + " " +
                            std::to_string(world) + " " + dir;
    std::vector<std::string> envs = {env};
    for (char** e = environ; *e; ++e) envs.push_back(*e);
    std::vector<char*> envp;
    for (auto& s : envs) envp.push_back(s.data());
    envp.push_back(nullptr);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return false;
    pids.push_back(pid);
  }
  bool ok = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ok = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::system(("rm -rf " + dir).c_str());
  return ok;
}

TEST(CudaIpcCommunicator, TwoProcessesOnOneGpu) {
  DSMESH_REQUIRE_GPU();
  EXPECT_TRUE(RunRanks("collectives", 2));
}

TEST(CudaIpcCommunicator, ThreeProcessesOnOneGpu) {
  DSMESH_REQUIRE_GPU();
  EXPECT_TRUE(RunRanks("collectives", 3));
}

TEST(CudaIpcCommunicator, APeerThatLeavesMakesTheOthersTimeOut) {
  DSMESH_REQUIRE_GPU();
  EXPECT_TRUE(RunRanks("peer-dies", 3));
}

}  // namespace
}  // namespace dsmesh

int main(int argc, char** argv) {
  if (const char* spec = std::getenv("DSMESH_IPC_CHILD")) return dsmesh::RunRank(spec);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

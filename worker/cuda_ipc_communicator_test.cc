// CudaIpcCommunicator with real processes on one GPU: the test binary runs itself once per rank (CUDA
// cannot be used in a child forked after the parent touched it), the ranks meet through a gloo FileStore
// in a fresh directory, and each rank checks its own results against sums computed on the host in rank
// order, bitwise. Each rank runs every collective twice: on the communicator's own stream, then on a
// stream handed over with set_stream (as the worker does with the CUDA backend's), with its device
// inputs still being written on that stream. A rank that leaves early must make the others fail with the
// timeout, not hang. The device decision the worker takes (RanksShareOneDevice) runs without a GPU.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
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

void HoldStream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }

// A device buffer holding `values`, written by a copy still queued on `producer` when this returns (with
// `hold`, a host function keeps the stream busy for 2 ms before the copy), over a NaN poison: a
// collective that does not wait for the producer stages the poison.
struct Produced {
  testing::DeviceBuffer<float> source, buffer;
};
Produced Produce(const std::vector<float>& values, cudaStream_t producer, bool hold) {
  Produced p{testing::DeviceBuffer<float>(values), testing::DeviceBuffer<float>(values.size())};
  p.buffer.PoisonNaN();
  CudaCheck(cudaDeviceSynchronize(), "test upload");  // the uploads ran on the legacy stream
  if (hold) CudaCheck(cudaLaunchHostFunc(producer, HoldStream, nullptr), "cudaLaunchHostFunc");
  CudaCheck(cudaMemcpyAsync(p.buffer.get(), p.source.get(), values.size() * sizeof(float), cudaMemcpyDeviceToDevice,
                            producer),
            "test copy");
  return p;
}

// A device buffer of n NaNs, ready before any stream's next work.
testing::DeviceBuffer<float> Poisoned(size_t n) {
  testing::DeviceBuffer<float> b(n);
  b.PoisonNaN();
  CudaCheck(cudaDeviceSynchronize(), "test poison");
  return b;
}

// A device result as the consumer sees it: with a stream handed to the communicator (`ordered`), after
// that stream's work; without one, at once (the collective has waited for its reads).
std::vector<float> Read(const testing::DeviceBuffer<float>& b, cudaStream_t ordered) {
  if (ordered) CudaCheck(cudaStreamSynchronize(ordered), "test stream synchronize");
  return b.Download();
}

// One pass of scenario "collectives": every collective on device and host buffers in every mix, sizes
// below, at and above the staging capacity, then 200 back to back (the double buffering under
// pressure). Device inputs come from work still queued on `producer`. `ordered`: the stream handed to
// the communicator (set_stream), or nullptr for its own.
void Collectives(CudaIpcCommunicator& comm, cudaStream_t producer, cudaStream_t ordered, int pass) {
  const int rank = comm.rank(), world = comm.world();
  const std::string where = ordered ? " (on the handed-over stream)" : " (own stream)";
  int salt = 100 * pass;
  for (size_t n : {size_t{1}, size_t{999}, kCapacity, size_t{2500}}) {
    ++salt;
    const std::string at = " n=" + std::to_string(n) + where;
    Produced d = Produce(Values(rank, n, salt), producer, true);
    comm.AllReduceSum(d.buffer.get(), n);
    ExpectBitwise(Read(d.buffer, ordered), ExpectedSum(world, n, salt), "device AllReduceSum" + at);
    std::vector<float> h = Values(rank, n, salt);
    comm.AllReduceSum(h.data(), n);
    ExpectBitwise(h, ExpectedSum(world, n, salt), "host AllReduceSum" + at);

    std::vector<float> want_gather;
    for (int r = 0; r < world; ++r) {
      auto v = Values(r, n, salt);
      want_gather.insert(want_gather.end(), v.begin(), v.end());
    }
    const std::vector<float> nan(world * n, std::nanf(""));
    {  // device in, device out
      Produced in = Produce(Values(rank, n, salt), producer, true);
      testing::DeviceBuffer<float> out = Poisoned(world * n);
      comm.AllGather(in.buffer.get(), n, out.get());
      ExpectBitwise(Read(out, ordered), want_gather, "device -> device AllGather" + at);
    }
    {  // device in, host out
      Produced in = Produce(Values(rank, n, salt), producer, true);
      std::vector<float> out = nan;
      comm.AllGather(in.buffer.get(), n, out.data());
      ExpectBitwise(out, want_gather, "device -> host AllGather" + at);
    }
    {  // host in, device out
      std::vector<float> in = Values(rank, n, salt);
      testing::DeviceBuffer<float> out = Poisoned(world * n);
      comm.AllGather(in.data(), n, out.get());
      ExpectBitwise(Read(out, ordered), want_gather, "host -> device AllGather" + at);
    }
    {  // host in, host out
      std::vector<float> in = Values(rank, n, salt), out = nan;
      comm.AllGather(in.data(), n, out.data());
      ExpectBitwise(out, want_gather, "host -> host AllGather" + at);
    }

    for (int root = 0; root < world; ++root) {
      const std::string from = " root " + std::to_string(root) + at;
      {
        Produced b = Produce(rank == root ? Values(root, n, salt) : std::vector<float>(n, std::nanf("")), producer,
                             true);
        comm.Broadcast(b.buffer.get(), n * sizeof(float), root);
        ExpectBitwise(Read(b.buffer, ordered), Values(root, n, salt), "device Broadcast" + from);
      }
      std::vector<float> h = rank == root ? Values(root, n, salt) : std::vector<float>(n, std::nanf(""));
      comm.Broadcast(h.data(), n * sizeof(float), root);
      ExpectBitwise(h, Values(root, n, salt), "host Broadcast" + from);
    }
  }
  // 200 back to back with no wait between them but the communicator's own (on the handed-over stream,
  // its reads are not waited for, so only its staging wait keeps a fast rank from overwriting a half a
  // peer still reads): inputs uploaded up front, results checked at the end. Sizes alternate between
  // one chunk and two.
  std::vector<size_t> sizes;
  std::vector<testing::DeviceBuffer<float>> inputs;
  for (int k = 0; k < 200; ++k) {
    sizes.push_back((k % 3 == 0) ? 1500 : 64 + k);
    inputs.emplace_back(Values(rank, sizes.back(), salt + k));
  }
  CudaCheck(cudaDeviceSynchronize(), "test upload");
  for (int k = 0; k < 200; ++k) comm.AllReduceSum(inputs[k].get(), sizes[k]);
  for (int k = 0; k < 200; ++k)
    ExpectBitwise(Read(inputs[k], ordered), ExpectedSum(world, sizes[k], salt + k),
                  "back-to-back AllReduceSum " + std::to_string(k) + where);
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
      cudaStream_t producer = nullptr;
      CudaCheck(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), "cudaStreamCreate");
      Collectives(comm, producer, nullptr, 1);
      comm.set_stream(DeviceStream{producer});  // as the worker hands over the CUDA backend's stream
      Collectives(comm, producer, producer, 2);
      comm.set_stream(DeviceStream{});
      cudaStreamDestroy(producer);
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
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return ok;
}

// CPU ranks (device -1) never share a device, so a CPU mesh keeps Gloo; every rank gets the same answer.
TEST(CudaIpcCommunicator, CpuRanksNeverShareADevice) {
  gloo::rendezvous::HashStore store;
  bool same[2] = {true, true};
  std::string why[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] { same[r] = CudaIpcCommunicator::RanksShareOneDevice(store, "dev", r, 2, -1, &why[r]); });
  for (auto& t : ranks) t.join();
  EXPECT_FALSE(same[0]);
  EXPECT_FALSE(same[1]);
  EXPECT_NE(why[0].find("rank 1 is on cpu/"), std::string::npos) << why[0];
  EXPECT_NE(why[1].find("rank 0 is on cpu/"), std::string::npos) << why[1];
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

#include "worker/cuda_ipc_communicator.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <stdexcept>
#include <thread>

#include "kernels/cuda/ipc_reduce.h"

namespace dsmesh {

// The shared-memory segment: a generation-counting barrier (lock-free atomics are address-free, so they
// work across processes that map the same pages).
struct IpcBarrier {
  std::atomic<uint64_t> arrived;
  std::atomic<uint64_t> generation;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

namespace {

std::vector<char> Bytes(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  return std::vector<char>(c, c + n);
}

std::vector<char> WaitGet(gloo::rendezvous::Store& store, const std::string& key) {
  store.wait({key});
  return store.get(key);
}

std::string HandleKey(int rank) { return "cuda_ipc_handle." + std::to_string(rank); }

// Device memory a kernel of this process may write; anything else (pageable or pinned host memory,
// managed memory) is treated as host memory: results go there by a copy, and are waited for.
bool IsDevicePointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // unregistered host memory on older runtimes: clear the (non-sticky) error
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

// Maps the barrier's segment `name` (opened with `flags`; O_CREAT sizes it).
IpcBarrier* MapBarrier(const std::string& name, int flags) {
  int fd = shm_open(name.c_str(), flags, 0600);
  if (fd < 0) throw std::runtime_error("cuda-ipc: shm_open " + name + ": " + std::strerror(errno));
  if ((flags & O_CREAT) && ftruncate(fd, sizeof(IpcBarrier)) != 0) {
    const int err = errno;
    close(fd);
    throw std::runtime_error("cuda-ipc: ftruncate " + name + ": " + std::strerror(err));
  }
  void* p = mmap(nullptr, sizeof(IpcBarrier), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("cuda-ipc: mmap " + name + ": " + std::strerror(err));
  return static_cast<IpcBarrier*>(p);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

std::string CudaIpcCommunicator::DeviceUuid(int device) {
  cudaDeviceProp prop{};
  cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess)
    throw std::runtime_error("cuda-ipc: cudaGetDeviceProperties(" + std::to_string(device) +
                             "): " + cudaGetErrorString(e));
  char hex[2 * sizeof(prop.uuid.bytes) + 1];
  for (size_t i = 0; i < sizeof(prop.uuid.bytes); ++i)
    std::snprintf(hex + 2 * i, 3, "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
  return hex;
}

bool CudaIpcCommunicator::RanksShareOneDevice(gloo::rendezvous::Store& store, const std::string& key_prefix,
                                              int rank, int world, int device, std::string* why) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // A CPU rank publishes a name no other rank can share.
  const std::string mine = device < 0 ? "cpu/" + std::string(host) + "/rank" + std::to_string(rank)
                                      : std::string(host) + "/" + DeviceUuid(device);
  store.set(key_prefix + "." + std::to_string(rank), Bytes(mine.data(), mine.size()));
  bool same = true;
  for (int r = 0; r < world; ++r) {
    std::vector<char> v = WaitGet(store, key_prefix + "." + std::to_string(r));
    const std::string theirs(v.begin(), v.end());
    if (theirs != mine && same) {
      same = false;
      if (why) *why = "rank " + std::to_string(r) + " is on " + theirs + ", rank " + std::to_string(rank) + " on " + mine;
    }
  }
  return same;
}

void CudaIpcCommunicator::Check(cudaError_t e, const char* what) const {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cuda-ipc: ") + what + " failed on rank " + std::to_string(rank_) + ": " +
                             cudaGetErrorString(e));
}

CudaIpcCommunicator::CudaIpcCommunicator(int rank, int world, gloo::rendezvous::Store& store, int device,
                                         std::chrono::milliseconds timeout, size_t capacity)
    : rank_(rank), world_(world), device_(device), timeout_(timeout), capacity_(capacity), peers_(world, nullptr) {
  if (world < 1 || world > kIpcMaxRanks)
    throw std::runtime_error("cuda-ipc: world " + std::to_string(world) + " (1.." + std::to_string(kIpcMaxRanks) +
                             " ranks supported)");
  if (capacity_ == 0) throw std::runtime_error("cuda-ipc: staging capacity must be > 0");
  std::string shm_name;  // rank 0's until it is unlinked
  try {
    Check(cudaSetDevice(device), "cudaSetDevice");
    std::string why;
    if (!RanksShareOneDevice(store, "cuda_ipc_device", rank, world, device, &why))
      throw std::runtime_error("cuda-ipc: the ranks are not on one device (" + why + ")");
    Check(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    Check(cudaMalloc(&staging_, 2 * capacity_ * sizeof(float)), "cudaMalloc (staging)");
    Check(cudaMalloc(&result_, capacity_ * sizeof(float)), "cudaMalloc (result)");
    cudaIpcMemHandle_t handle;
    Check(cudaIpcGetMemHandle(&handle, staging_), "cudaIpcGetMemHandle");
    store.set(HandleKey(rank), Bytes(&handle, sizeof(handle)));

    // The barrier's shared memory: rank 0 creates it under a fresh name and publishes the name.
    const std::string name_key = "cuda_ipc_shm";
    if (rank == 0) {
      std::random_device rd;
      const std::string name = "/dsmesh-ipc-" + std::to_string(getpid()) + "-" + std::to_string(rd());
      barrier_ = MapBarrier(name, O_CREAT | O_EXCL | O_RDWR);
      shm_name = name;
      barrier_ = new (barrier_) IpcBarrier{};
      barrier_->arrived.store(0);
      barrier_->generation.store(0);
      store.set(name_key, Bytes(name.data(), name.size()));
    } else {
      std::vector<char> v = WaitGet(store, name_key);
      barrier_ = MapBarrier(std::string(v.begin(), v.end()), O_RDWR);
    }
    for (int r = 0; r < world; ++r) {
      if (r == rank) {
        peers_[r] = staging_;
        continue;
      }
      std::vector<char> v = WaitGet(store, HandleKey(r));
      if (v.size() != sizeof(cudaIpcMemHandle_t))
        throw std::runtime_error("cuda-ipc: " + HandleKey(r) + " holds " + std::to_string(v.size()) + " bytes");
      cudaIpcMemHandle_t h;
      std::memcpy(&h, v.data(), sizeof(h));
      void* p = nullptr;
      Check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      peers_[r] = static_cast<float*>(p);
    }
    // Everyone has mapped the segment: its name can go (the mappings stay valid until munmap).
    Barrier("joining");
  } catch (...) {
    if (!shm_name.empty()) shm_unlink(shm_name.c_str());
    Release();
    throw;
  }
  if (!shm_name.empty()) shm_unlink(shm_name.c_str());
  std::fprintf(stderr, "[worker %d/%d] communicator cuda-ipc on device %d (%s): %zu floats x 2 staging\n", rank,
               world, device, DeviceUuid(device).c_str(), capacity_);
}

CudaIpcCommunicator::~CudaIpcCommunicator() { Release(); }

void CudaIpcCommunicator::Release() noexcept {
  if (device_ >= 0) cudaSetDevice(device_);
  // The last collective's reads may still be queued (on a borrowed stream that may be gone by now): wait
  // for the whole device rather than that stream. Errors are ignored: nothing here may throw.
  cudaDeviceSynchronize();
  // The ranks tear down in no common order, so a peer may still hold this rank's buffer mapped when it is
  // freed here; no collective runs any more, so nothing reads through that mapping (and a peer that died
  // cannot be waited for).
  for (int r = 0; r < world_ && r < static_cast<int>(peers_.size()); ++r)
    if (r != rank_ && peers_[r]) cudaIpcCloseMemHandle(peers_[r]);
  peers_.assign(peers_.size(), nullptr);
  if (staging_) cudaFree(staging_);
  if (result_) cudaFree(result_);
  if (own_stream_) cudaStreamDestroy(own_stream_);
  if (barrier_) munmap(barrier_, sizeof(IpcBarrier));
  staging_ = result_ = nullptr;
  own_stream_ = nullptr;
  barrier_ = nullptr;
}

void CudaIpcCommunicator::set_stream(DeviceStream stream) {
  // Reads of the last collective may still be queued on the stream being replaced (which may be gone):
  // wait for the whole device, so that the next staging's wait on the new stream covers everything.
  Check(cudaDeviceSynchronize(), "set_stream");
  borrowed_stream_ = static_cast<cudaStream_t>(stream.cuda_stream);
}

void CudaIpcCommunicator::Barrier(const char* what) {
  const uint64_t gen = barrier_->generation.load(std::memory_order_acquire);
  if (barrier_->arrived.fetch_add(1, std::memory_order_acq_rel) == static_cast<uint64_t>(world_) - 1) {
    // The last to arrive: reset the count before releasing the others (they may arrive at the next
    // barrier as soon as they see the new generation).
    barrier_->arrived.store(0, std::memory_order_relaxed);
    barrier_->generation.fetch_add(1, std::memory_order_release);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t spins = 0; barrier_->generation.load(std::memory_order_acquire) == gen; ++spins) {
    if (spins < 4096) {
      CpuRelax();
      continue;
    }
    std::this_thread::yield();
    if ((spins & 1023) == 0) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited > timeout_)
        throw std::runtime_error(
            std::string("cuda-ipc: ") + what + " on rank " + std::to_string(rank_) + " of " +
            std::to_string(world_) + " timed out after " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) +
            " ms waiting for the other ranks (limit " + std::to_string(timeout_.count()) +
            " ms; did a peer die or stop calling?)");
    }
  }
}

void CudaIpcCommunicator::WaitForProducers() {
  if (borrowed_stream_) {
    Check(cudaStreamSynchronize(borrowed_stream_), "waiting for this rank's stream");
  } else {
    Check(cudaDeviceSynchronize(), "waiting for this rank's device work");
  }
}

void CudaIpcCommunicator::Stage(const void* src, size_t bytes) {
  // With a borrowed stream the copy is ordered after the producers and the synchronize below waits for
  // both; without one, the whole device is waited for first.
  if (!borrowed_stream_) WaitForProducers();
  Check(cudaMemcpyAsync(Half(), src, bytes, cudaMemcpyDefault, Stream()), "staging copy");
  Check(cudaStreamSynchronize(Stream()), "staging copy (or earlier work on this rank's stream)");
  bytes_ += static_cast<int64_t>(bytes);
}

void CudaIpcCommunicator::Finish(bool host_result) {
  if (host_result || !borrowed_stream_) Check(cudaStreamSynchronize(Stream()), "reading the peers' buffers");
  half_ ^= 1;
}

void CudaIpcCommunicator::AllReduceSum(float* data, size_t n) {
  ++collectives_;
  if (world_ == 1 || n == 0) return;
  const bool device = IsDevicePointer(data);
  for (size_t off = 0; off < n; off += capacity_) {
    const size_t len = std::min(capacity_, n - off);
    Stage(data + off, len * sizeof(float));
    Barrier("AllReduceSum");
    const float* halves[kIpcMaxRanks];
    for (int r = 0; r < world_; ++r) halves[r] = PeerHalf(r);
    LaunchSumPeers(device ? data + off : result_, halves, world_, len, Stream());
    if (!device)
      Check(cudaMemcpyAsync(data + off, result_, len * sizeof(float), cudaMemcpyDefault, Stream()), "result copy");
    Finish(!device);
  }
}

void CudaIpcCommunicator::AllGather(const float* in, size_t n, float* out) {
  ++collectives_;
  if (n == 0) return;
  const bool host_out = !IsDevicePointer(out);
  if (world_ == 1) {
    if (out != in) {
      if (!borrowed_stream_) WaitForProducers();
      Check(cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDefault, Stream()), "AllGather copy");
      if (host_out || !borrowed_stream_) Check(cudaStreamSynchronize(Stream()), "AllGather copy");
    }
    return;
  }
  for (size_t off = 0; off < n; off += capacity_) {
    const size_t len = std::min(capacity_, n - off);
    Stage(in + off, len * sizeof(float));
    Barrier("AllGather");
    for (int r = 0; r < world_; ++r)
      Check(cudaMemcpyAsync(out + static_cast<size_t>(r) * n + off, PeerHalf(r), len * sizeof(float),
                            cudaMemcpyDefault, Stream()),
            "AllGather copy");
    Finish(host_out);
  }
}

void CudaIpcCommunicator::Broadcast(void* data, size_t bytes, int root) {
  ++collectives_;
  if (root < 0 || root >= world_)
    throw std::runtime_error("cuda-ipc: Broadcast from rank " + std::to_string(root) + " of " +
                             std::to_string(world_));
  if (world_ == 1 || bytes == 0) return;
  const bool host_result = rank_ != root && !IsDevicePointer(data);
  const size_t cap = capacity_ * sizeof(float);
  char* p = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += cap) {
    const size_t len = std::min(cap, bytes - off);
    if (rank_ == root) {
      Stage(p + off, len);
    } else {
      // Nothing to stage, but the barrier still tells the root that this rank's earlier reads are done
      // and that its producers have finished with `data`.
      WaitForProducers();
    }
    Barrier("Broadcast");
    if (rank_ != root)
      Check(cudaMemcpyAsync(p + off, PeerHalf(root), len, cudaMemcpyDefault, Stream()), "Broadcast copy");
    Finish(host_result);
  }
}

}  // namespace dsmesh

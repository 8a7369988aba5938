#include "worker/nccl_communicator.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/nccl_abi.h"

namespace dsmesh {

struct NcclLibrary {
  void* handle = nullptr;
  nccl::GetUniqueIdFn GetUniqueId = nullptr;
  nccl::CommInitRankFn CommInitRank = nullptr;
  nccl::CommAbortFn CommAbort = nullptr;
  nccl::AllReduceFn AllReduce = nullptr;
  nccl::AllGatherFn AllGather = nullptr;
  nccl::BroadcastFn Broadcast = nullptr;
  nccl::GetErrorStringFn GetErrorString = nullptr;
  ~NcclLibrary() {
    if (handle) dlclose(handle);
  }
};

std::shared_ptr<NcclLibrary> NcclCommunicator::Load() {
  const char* env = std::getenv("DSMESH_NCCL_LIBRARY");
  const std::string path = env && *env ? env : "libnccl.so.2";
  auto lib = std::make_shared<NcclLibrary>();
  lib->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle)
    throw std::runtime_error("nccl: cannot load " + path + ": " + dlerror() +
                             " (put NCCL's lib/ folder on LD_LIBRARY_PATH or set DSMESH_NCCL_LIBRARY)");
  auto sym = [&](const char* name) {
    void* p = dlsym(lib->handle, name);
    if (!p) throw std::runtime_error("nccl: " + path + " lacks symbol " + name);
    return p;
  };
  lib->GetUniqueId = reinterpret_cast<decltype(lib->GetUniqueId)>(sym("ncclGetUniqueId"));
  lib->CommInitRank = reinterpret_cast<decltype(lib->CommInitRank)>(sym("ncclCommInitRank"));
  lib->CommAbort = reinterpret_cast<decltype(lib->CommAbort)>(sym("ncclCommAbort"));
  lib->AllReduce = reinterpret_cast<decltype(lib->AllReduce)>(sym("ncclAllReduce"));
  lib->AllGather = reinterpret_cast<decltype(lib->AllGather)>(sym("ncclAllGather"));
  lib->Broadcast = reinterpret_cast<decltype(lib->Broadcast)>(sym("ncclBroadcast"));
  lib->GetErrorString = reinterpret_cast<decltype(lib->GetErrorString)>(sym("ncclGetErrorString"));
  return lib;
}

void NcclCommunicator::Check(int result, const char* what) const {
  if (result != nccl::kSuccess)
    throw std::runtime_error(std::string("nccl: ") + what + " failed on rank " + std::to_string(rank_) + ": " +
                             lib_->GetErrorString(result));
}

NcclCommunicator::NcclCommunicator(int rank, int world, gloo::rendezvous::Store& store, DeviceStream stream)
    : rank_(rank), world_(world), stream_(stream.cuda_stream), lib_(Load()) {
  nccl::UniqueId id;
  const std::string key = "nccl_unique_id";
  if (rank == 0) {
    Check(lib_->GetUniqueId(&id), "ncclGetUniqueId");
    store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    store.wait({key});
    std::vector<char> bytes = store.get(key);
    if (bytes.size() != sizeof(id.internal))
      throw std::runtime_error("nccl: rendezvous key " + key + " holds " + std::to_string(bytes.size()) +
                               " bytes, expected " + std::to_string(sizeof(id.internal)));
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  nccl::Comm comm = nullptr;
  Check(lib_->CommInitRank(&comm, world, id, rank), "ncclCommInitRank");
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  // Abort rather than destroy: after a peer died a destroy can wait forever for it.
  if (comm_) lib_->CommAbort(static_cast<nccl::Comm>(comm_));
}

void NcclCommunicator::AllReduceSum(float* data, size_t n) {
  Check(lib_->AllReduce(data, data, n, nccl::kFloat32, nccl::kSum, static_cast<nccl::Comm>(comm_),
                        stream_),
        "ncclAllReduce");
}

void NcclCommunicator::AllGather(const float* in, size_t n, float* out) {
  Check(lib_->AllGather(in, out, n, nccl::kFloat32, static_cast<nccl::Comm>(comm_), stream_),
        "ncclAllGather");
}

void NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  Check(lib_->Broadcast(data, data, bytes, nccl::kUint8, root, static_cast<nccl::Comm>(comm_),
                        stream_),
        "ncclBroadcast");
}

}  // namespace dsmesh

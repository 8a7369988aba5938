// The slice of NCCL's C ABI the NCCL communicator uses, declared here because Bazel (offline, no CUDA
// repository rule) refuses include paths outside the workspace, so <nccl.h> cannot be included.
// Values are those of /usr/local/cuda/include/nccl.h (NCCL 2.x); nccl_abi_test.cc checks them against that
// header's text whenever it is present. The functions are resolved with dlsym at run time.
#pragma once

#include <cstddef>

namespace dsmesh::nccl {

constexpr size_t kUniqueIdBytes = 128;           // NCCL_UNIQUE_ID_BYTES
struct UniqueId {
  char internal[kUniqueIdBytes];
};
using Comm = struct ncclComm*;                   // ncclComm_t
using Stream = void*;                            // cudaStream_t
using Result = int;                              // ncclResult_t
constexpr Result kSuccess = 0;                   // ncclSuccess
constexpr int kSum = 0;                          // ncclSum (ncclRedOp_t)
constexpr int kUint8 = 1;                        // ncclUint8 (ncclDataType_t)
constexpr int kFloat32 = 7;                      // ncclFloat32

using GetUniqueIdFn = Result (*)(UniqueId*);
using CommInitRankFn = Result (*)(Comm*, int nranks, UniqueId id, int rank);
using CommAbortFn = Result (*)(Comm);
using AllReduceFn = Result (*)(const void*, void*, size_t, int dtype, int op, Comm, Stream);
using AllGatherFn = Result (*)(const void*, void*, size_t, int dtype, Comm, Stream);
using BroadcastFn = Result (*)(const void*, void*, size_t, int dtype, int root, Comm, Stream);
using GetErrorStringFn = const char* (*)(Result);

}  // namespace dsmesh::nccl

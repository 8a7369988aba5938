// The reduction of CudaIpcCommunicator (worker/cuda_ipc_communicator.h): the ranks' staged buffers,
// mapped into this process through CUDA IPC, summed element by element.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace dsmesh {

constexpr int kIpcMaxRanks = 8;

// out[i] = peers[0][i] + peers[1][i] + ... + peers[world-1][i], added in rank order so that every rank
// computes bitwise the same sums (the CPU loop `s = p0; s += p1; ...` in fp32 gives the same bits).
// out may be one of the peers. Enqueued on `stream`; throws std::runtime_error on a launch error.
void LaunchSumPeers(float* out, const float* const* peers, int world, size_t n, cudaStream_t stream);

}  // namespace dsmesh

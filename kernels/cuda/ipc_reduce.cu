#include "kernels/cuda/ipc_reduce.h"

#include <stdexcept>
#include <string>

namespace dsmesh {
namespace {

struct PeerPointers {
  const float* p[kIpcMaxRanks];
};

__global__ void SumPeersKernel(float* out, PeerPointers peers, int world, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float s = peers.p[0][i];
    for (int r = 1; r < world; ++r) s += peers.p[r][i];
    out[i] = s;
  }
}

}  // namespace

void LaunchSumPeers(float* out, const float* const* peers, int world, size_t n, cudaStream_t stream) {
  if (world < 1 || world > kIpcMaxRanks)
    throw std::runtime_error("LaunchSumPeers: " + std::to_string(world) + " ranks (1.." +
                             std::to_string(kIpcMaxRanks) + " supported)");
  if (n == 0) return;
  PeerPointers pp{};
  for (int r = 0; r < world; ++r) pp.p[r] = peers[r];
  const int threads = 256;
  const size_t want = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 1024 ? want : 1024);
  SumPeersKernel<<<blocks, threads, 0, stream>>>(out, pp, world, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("SumPeersKernel launch: ") + cudaGetErrorString(e));
}

}  // namespace dsmesh

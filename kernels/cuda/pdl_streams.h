// Which streams launch the decode chain's kernels with programmatic dependent launch (PDL, sm_90+;
// pdl_launch.cuh), and the launch counter of each. A CUDA backend built with CudaBackendOptions::pdl
// enables it on its own stream; every other stream (side streams, tests' and benches' own streams) keeps
// plain launches. The kernels' launchers take a stream and nothing else of the backend, so the flag is
// keyed by the stream rather than plumbed through every op's parameters.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace dsmesh {

// Launches through PdlLaunch on `stream` carry the PDL attribute from now on, each adding one to
// *launches (which must outlive the registration). Throws when more streams are registered at once than
// the table holds (kMaxPdlStreams).
constexpr int kMaxPdlStreams = 64;
void EnablePdlOnStream(cudaStream_t stream, std::atomic<int64_t>* launches);
// Plain launches on `stream` again (a backend calls it before its stream goes away).
void DisablePdlOnStream(cudaStream_t stream);
// The counter `stream` was registered with, or null: launches on it are plain.
std::atomic<int64_t>* PdlLaunchCounter(cudaStream_t stream);

}  // namespace dsmesh

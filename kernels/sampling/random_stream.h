// Counter-based random numbers for sampling: a value depends only on (seed, position, stream), so a request
// draws the same numbers whatever it is batched with, after a preemption that recomputes it, and whether or
// not it speculates. Stream kSample is the plain sampler's draw; the rejection sampler uses the others.
// Host and device code (the CUDA sampling kernels draw the same numbers as worker/sampler.cc).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSMESH_HOST_DEVICE __host__ __device__
#else
#define DSMESH_HOST_DEVICE
#endif

namespace dsmesh {

enum class RandomStream : uint64_t {
  kSample = 0,   // the sampler's draw at a position (also the bonus token after all drafts pass)
  kDraft = 1,    // drawing a draft at a position from the MTP head's distribution
  kAccept = 2,   // the uniform u that accepts a draft when u < p(d) / q(d)
  kRecover = 3,  // drawing the recovery token from normalize(max(p - q, 0))
};

// SplitMix64 finalizer.
DSMESH_HOST_DEVICE inline uint64_t MixBits(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits.
DSMESH_HOST_DEVICE inline double Uniform01(uint64_t seed, int64_t position, RandomStream stream = RandomStream::kSample) {
  uint64_t s = MixBits(seed);
  if (stream != RandomStream::kSample) s = MixBits(s ^ MixBits(static_cast<uint64_t>(stream) * 0xA24BAED4963EE407ull));
  const uint64_t bits = MixBits(s ^ MixBits(static_cast<uint64_t>(position) * 0xD1B54A32D192ED03ull));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace dsmesh

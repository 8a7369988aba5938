// The checks a request's sampling parameters (SamplingParams in proto/mesh.proto) must pass: the
// coordinator runs them at admission so a bad request never reaches a worker; worker/sampler.h samples.
#pragma once

#include <cstdint>

#include "proto/mesh.pb.h"

namespace dsmesh {

// Throws std::invalid_argument naming the field ("sampling.top_p must be in (0, 1]") for an out-of-range value.
void ValidateSamplingParams(const SamplingParams& params, int64_t vocab_size);

}  // namespace dsmesh

// Synthetic EXL3 weights: random but valid trellises, suh and svh generated from a seed and each value's
// position, so that any block of a linear (a tensor-parallel slice) can be generated on its own, on the
// host or on the device, with identical bits. Used for full-size models without files (a 141 GB GPU
// holds the ~86 GB pack, the machine's disk does not): every 16-bit trellis word is a valid encoding,
// suh = +-1/sqrt(k) and svh = +-1 (random signs) keep y = x W at the RMS of x for unit-variance codebooks.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/exl3/exl3_linear.h"
#include "kernels/exl3/synthetic_hash.h"

namespace dsmesh {

// The whole linear (padded k x n, MCG codebook) on the host: the CPU reference of the device generator.
Exl3Weight SyntheticExl3Weight(const std::string& name, int64_t in_features, int64_t out_features, int K,
                               uint64_t seed);

}  // namespace dsmesh

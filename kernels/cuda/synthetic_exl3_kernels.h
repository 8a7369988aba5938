// Device generator of synthetic EXL3 weights (kernels/exl3/synthetic_hash.h; host twin:
// kernels/exl3/synthetic_exl3.h): the [k0, k1) x [n0, n1) block (multiples of 128) of a synthetic
// full_k x full_n MCG linear, written as a linear of its own (trellis [(k1-k0)/16, (n1-n0)/16, 16K],
// suh [k1-k0], svh [n1-n0]; fp16 bit patterns).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsmesh {

void FillSyntheticExl3Block(uint16_t* trellis, uint16_t* suh, uint16_t* svh, int64_t k0, int64_t k1, int64_t n0,
                            int64_t n1, int64_t full_k, int64_t full_n, int K, uint64_t seed, cudaStream_t stream);

}  // namespace dsmesh

// y = x W^T for a dense weight W [out, in] stored as bf16, fp16 or f32, with f32 activations: the CPU
// backend's hot loop. Weights are read once per group of up to 4 activation rows and widened in registers.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace dsmesh {
namespace cpu {

// x: m rows with stride ldx; W: out rows with stride ldw (elements); y: m rows with stride ldy.
// Parallel over output rows (OpenMP).
void DenseLinear(const float* x, int64_t ldx, int64_t m, const void* w, DType wtype, int64_t ldw, int64_t out,
                 int64_t in, float* y, int64_t ldy);

// The plain reference (scalar loops, double accumulation), for tests.
void DenseLinearReference(const float* x, int64_t ldx, int64_t m, const void* w, DType wtype, int64_t ldw,
                          int64_t out, int64_t in, float* y, int64_t ldy);

}  // namespace cpu
}  // namespace dsmesh

// The CPU backend's vision-encoder ops (kernels/backend.h, "vision encoder"), as plain fp32 loops over
// host arrays: rotate-half RoPE with per-row angles, attention inside spans, exact GELU, the r x r unfold.
// cpu_backend.cc forwards the Backend ops here after checking shapes.
#pragma once

#include <cstdint>

namespace dsmesh {
namespace cpu {

// x [n, heads * head_dim]; (x[i], x[i + head_dim/2]) of every head rotated by angles[r * head_dim/2 + i].
void RotateHalf(float* x, int64_t n, int64_t heads, int64_t head_dim, const float* angles);

// q, k, v, out [n, heads * d]; rows of span s are [spans[s], spans[s+1]) and see only each other.
void SpanAttention(const float* q, const float* k, const float* v, int64_t heads, int64_t d, const int64_t* spans,
                   int64_t num_spans, float softmax_scale, float* out);

void Gelu(float* x, int64_t n);

// x [h*w, C] -> out [ceil(h/r) * ceil(w/r), C*r*r] (every element written).
void Unfold2D(const float* x, int64_t h, int64_t w, int64_t C, int r, float* out);

}  // namespace cpu
}  // namespace dsmesh

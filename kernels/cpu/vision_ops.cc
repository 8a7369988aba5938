#include "kernels/cpu/vision_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec.h"

namespace dsmesh {
namespace cpu {

void RotateHalf(float* x, int64_t n, int64_t heads, int64_t head_dim, const float* angles) {
  const int64_t half = head_dim / 2;
  ParallelFor(n, n * heads * head_dim, [&](int64_t r) {
    // cos/sin once per row: every head of the row shares the angles.
    thread_local std::vector<float> cs, sn;
    cs.resize(half);
    sn.resize(half);
    for (int64_t i = 0; i < half; ++i) {
      cs[i] = std::cos(angles[r * half + i]);
      sn[i] = std::sin(angles[r * half + i]);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* p = x + (r * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = p[i], b = p[i + half];
        p[i] = a * cs[i] - b * sn[i];
        p[i + half] = b * cs[i] + a * sn[i];
      }
    }
  });
}

void SpanAttention(const float* q, const float* k, const float* v, int64_t heads, int64_t d, const int64_t* spans,
                   int64_t num_spans, float softmax_scale, float* out) {
  const int64_t n = spans[num_spans], width = heads * d;
  // Which span each row is in, so the parallel loop can run over (row, head) pairs of every span at once.
  std::vector<int64_t> span_of(n);
  int64_t work = 0;
  for (int64_t s = 0; s < num_spans; ++s) {
    for (int64_t r = spans[s]; r < spans[s + 1]; ++r) span_of[r] = s;
    work += (spans[s + 1] - spans[s]) * (spans[s + 1] - spans[s]) * width * 2;
  }
  ParallelFor(n * heads, work, [&](int64_t flat_index) {
    const int64_t r = flat_index / heads, h = flat_index % heads;
    const int64_t b = spans[span_of[r]], e = spans[span_of[r] + 1];
    thread_local std::vector<float> s;
    s.resize(e - b);
    const float* qh = q + r * width + h * d;
    float mx = -INFINITY;
    for (int64_t j = b; j < e; ++j) mx = std::max(mx, s[j - b] = Dot(qh, k + j * width + h * d, d) * softmax_scale);
    float denom = 0;
    for (int64_t j = b; j < e; ++j) denom += (s[j - b] = std::exp(s[j - b] - mx));
    float* o = out + r * width + h * d;
    std::fill(o, o + d, 0.0f);
    for (int64_t j = b; j < e; ++j) Axpy(s[j - b] / denom, v + j * width + h * d, o, d);
  });
}

void Gelu(float* x, int64_t n) {
  constexpr int64_t kChunk = 4096;
  ParallelFor((n + kChunk - 1) / kChunk, n * 16, [&](int64_t c) {
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i)
      x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
  });
}

void Unfold2D(const float* x, int64_t h, int64_t w, int64_t C, int r, float* out) {
  const int64_t bh = (h + r - 1) / r, bw = (w + r - 1) / r, rr = static_cast<int64_t>(r) * r;
  ParallelFor(bh * bw, bh * bw * C * rr, [&](int64_t block) {
    const int64_t by = block / bw, bx = block % bw;
    float* o = out + block * C * rr;
    for (int64_t dy = 0; dy < r; ++dy)
      for (int64_t dx = 0; dx < r; ++dx) {
        const int64_t y = by * r + dy, xx = bx * r + dx, slot = dy * r + dx;
        const float* src = y < h && xx < w ? x + (y * w + xx) * C : nullptr;
        for (int64_t c = 0; c < C; ++c) o[c * rr + slot] = src ? src[c] : 0.0f;
      }
  });
}

}  // namespace cpu
}  // namespace dsmesh

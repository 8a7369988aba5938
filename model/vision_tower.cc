#include "model/vision_tower.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dsmesh {
namespace {

int64_t RowWidth(const Tensor& t) { return t.shape.empty() || t.shape[0] == 0 ? 0 : t.numel() / t.shape[0]; }

}  // namespace

int64_t AlignerRows(const VitGrid& g, int r) {
  return static_cast<int64_t>((g.h + r - 1) / r) * ((g.w + r - 1) / r);
}

std::vector<float> VisionRopeAngles(const VitGrid& g, int head_dim, double theta) {
  // rope_dim = head_dim / 2 angles per patch: rope_dim / 2 frequencies, once for the row, once for the column.
  const int rope_dim = head_dim / 2, freqs = rope_dim / 2;
  std::vector<float> inv_freq(freqs);
  for (int i = 0; i < freqs; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  std::vector<float> angles(static_cast<size_t>(g.h) * g.w * rope_dim);
  for (int y = 0; y < g.h; ++y)
    for (int x = 0; x < g.w; ++x) {
      float* a = &angles[(static_cast<size_t>(y) * g.w + x) * rope_dim];
      for (int i = 0; i < freqs; ++i) {
        a[i] = static_cast<float>(y) * inv_freq[i];
        a[freqs + i] = static_cast<float>(x) * inv_freq[i];
      }
    }
  return angles;
}

Tensor RunVit(Backend& be, const VisionConfig& c, const VisionWeights& w, const Tensor& patches,
              const std::vector<VitGrid>& grids) {
  const int64_t dim = c.dim, heads = c.n_heads, hd = c.head_dim();
  std::vector<int64_t> spans = {0};
  std::vector<float> angles;
  for (const VitGrid& g : grids) {
    if (g.h <= 0 || g.w <= 0) throw std::runtime_error("vision tower: an image has an empty patch grid");
    spans.push_back(spans.back() + static_cast<int64_t>(g.h) * g.w);
    std::vector<float> a = VisionRopeAngles(g, static_cast<int>(hd), c.rope_theta);
    angles.insert(angles.end(), a.begin(), a.end());
  }
  const int64_t n = spans.back();
  if (patches.shape.empty() || patches.shape[0] != n || RowWidth(patches) != w.patch_embed.in)
    throw std::runtime_error("vision tower: patches " + patches.ShapeString() + " do not match the grids (" +
                             std::to_string(n) + " patches of " + std::to_string(w.patch_embed.in) + ")");
  Tensor rope = be.Alloc(DType::kF32, {n, hd / 2});
  be.FromHost(angles.data(), &rope);

  Tensor x = be.Alloc(DType::kF32, {n, dim});
  be.Linear(patches, w.patch_embed, &x);
  Tensor h = be.Alloc(DType::kF32, {n, dim}), q = be.Alloc(DType::kF32, {n, dim}), k = be.Alloc(DType::kF32, {n, dim}),
         v = be.Alloc(DType::kF32, {n, dim}), attn = be.Alloc(DType::kF32, {n, dim});
  const float eps = static_cast<float>(c.norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const VisionBlockWeights& b : w.blocks) {
    be.RmsNorm(x, dim, &b.norm1, eps, &h);
    be.LinearBatch({{&h, &b.wq, &q}, {&h, &b.wk, &k}, {&h, &b.wv, &v}});
    be.RotateHalf(&q, heads, hd, rope);
    be.RotateHalf(&k, heads, hd, rope);
    be.SpanAttention(q, k, v, heads, hd, spans.data(), static_cast<int64_t>(grids.size()), scale, &attn);
    be.Linear(attn, b.wo, &h);
    be.Add(h, &x);
    be.RmsNorm(x, dim, &b.norm2, eps, &h);
    // SwiGLU without clamp (limit 0), accumulated into the residual: x += w2(silu(w1 h) * w3 h).
    be.SharedExpert(h, b.mlp, 0.0f, &x);
  }
  be.RmsNorm(x, dim, &w.norm, eps, &x);
  return x;
}

Tensor RunVisionTower(Backend& be, const VisionConfig& c, const VisionWeights& w, const Tensor& patches,
                      const std::vector<VitGrid>& grids) {
  const Tensor x = RunVit(be, c, w, patches, grids);
  const int r = c.downsample_ratio;
  int64_t rows = 0;
  for (const VitGrid& g : grids) rows += AlignerRows(g, r);
  Tensor merged = be.Alloc(DType::kF32, {rows, static_cast<int64_t>(c.dim) * r * r});
  int64_t in_row = 0, out_row = 0;
  for (const VitGrid& g : grids) {
    const int64_t n = static_cast<int64_t>(g.h) * g.w, m = AlignerRows(g, r);
    Tensor dst = RowView(merged, out_row, m);
    be.Unfold2D(RowView(x, in_row, n), g.h, g.w, r, &dst);
    in_row += n;
    out_row += m;
  }
  Tensor hidden = be.Alloc(DType::kF32, {rows, w.aligner_w1.out});
  be.Linear(merged, w.aligner_w1, &hidden);
  be.Gelu(&hidden);
  Tensor out = be.Alloc(DType::kF32, {rows, w.aligner_w2.out});
  be.Linear(hidden, w.aligner_w2, &out);
  return out;
}

}  // namespace dsmesh

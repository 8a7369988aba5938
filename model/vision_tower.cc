#include "model/vision_tower.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dsmesh {
namespace {

int64_t RowWidth(const Tensor& t) { return t.shape.empty() || t.shape[0] == 0 ? 0 : t.numel() / t.shape[0]; }

// Throws unless `comm` spans the `world` ranks a part of the tower is split over (any comm, or none, for 1).
void CheckSplit(const Communicator* comm, int world, const char* part) {
  if (world == 1) return;
  const int have = comm ? comm->world() : 1;
  if (have != world)
    throw std::runtime_error(std::string("vision tower: the ") + part + " is split over " + std::to_string(world) +
                             " ranks but the communicator spans " + std::to_string(have));
}

// In-place sum of t over the ranks of a split of `world` ranks (nothing for 1). As ModelImpl::AllReduce:
// device tensors with a host communicator (Gloo) go through a host copy.
void SumOverRanks(Backend& be, Communicator* comm, int world, Tensor* t) {
  if (world == 1) return;
  if (be.host_memory() == !comm->device_buffers()) {
    comm->AllReduceSum(static_cast<float*>(t->data), static_cast<size_t>(t->numel()));
    return;
  }
  std::vector<float> host(static_cast<size_t>(t->numel()));
  be.ToHost(*t, host.data());
  comm->AllReduceSum(host.data(), host.size());
  be.FromHost(host.data(), t);
}

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
              const std::vector<VitGrid>& grids, Communicator* comm) {
  CheckSplit(comm, w.tower_world, "ViT");
  // This rank's heads: all of them when the tower is whole (local_heads is 0 in hand-built weights).
  const int64_t dim = c.dim, heads = w.tower_world > 1 ? w.local_heads : c.n_heads, hd = c.head_dim();
  const int64_t local = heads * hd;
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
  Tensor h = be.Alloc(DType::kF32, {n, dim}), q = be.Alloc(DType::kF32, {n, local}),
         k = be.Alloc(DType::kF32, {n, local}), v = be.Alloc(DType::kF32, {n, local}),
         attn = be.Alloc(DType::kF32, {n, local});
  Tensor mlp_out = w.tower_world > 1 ? be.Alloc(DType::kF32, {n, dim}) : Tensor{};  // sharded MLP's share
  const float eps = static_cast<float>(c.norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const VisionBlockWeights& b : w.blocks) {
    be.RmsNorm(x, dim, &b.norm1, eps, &h);
    be.LinearBatch({{&h, &b.wq, &q}, {&h, &b.wk, &k}, {&h, &b.wv, &v}});
    be.RotateHalf(&q, heads, hd, rope);
    be.RotateHalf(&k, heads, hd, rope);
    be.SpanAttention(q, k, v, heads, hd, spans.data(), static_cast<int64_t>(grids.size()), scale, &attn);
    // wo over this rank's heads: a partial sum (bias on one rank) until summed over the ranks.
    be.Linear(attn, b.wo, &h);
    SumOverRanks(be, comm, w.tower_world, &h);
    be.Add(h, &x);
    be.RmsNorm(x, dim, &b.norm2, eps, &h);
    // SwiGLU without clamp (limit 0): x += w2(silu(w1 h) * w3 h). Whole, SharedExpert accumulates into the
    // residual; sharded, each rank accumulates its columns' share into the zeroed mlp_out, and the shares
    // are summed over the ranks before they join the residual.
    if (w.tower_world == 1) {
      be.SharedExpert(h, b.mlp, 0.0f, &x);
      continue;
    }
    be.Zero(&mlp_out);
    be.SharedExpert(h, b.mlp, 0.0f, &mlp_out);
    SumOverRanks(be, comm, w.tower_world, &mlp_out);
    be.Add(mlp_out, &x);
  }
  be.RmsNorm(x, dim, &w.norm, eps, &x);
  return x;
}

Tensor RunVisionTower(Backend& be, const VisionConfig& c, const VisionWeights& w, const Tensor& patches,
                      const std::vector<VitGrid>& grids, Communicator* comm) {
  CheckSplit(comm, w.aligner_world, "aligner");
  const Tensor x = RunVit(be, c, w, patches, grids, comm);
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
  // w1 gives this rank's hidden columns (all of them when whole), w2 their share of every output.
  Tensor hidden = be.Alloc(DType::kF32, {rows, w.aligner_w1.out});
  be.Linear(merged, w.aligner_w1, &hidden);
  be.Gelu(&hidden);
  Tensor out = be.Alloc(DType::kF32, {rows, w.aligner_w2.out});
  be.Linear(hidden, w.aligner_w2, &out);
  SumOverRanks(be, comm, w.aligner_world, &out);
  return out;
}

}  // namespace dsmesh

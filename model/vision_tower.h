// The vision tower of DeepSeek-V4-Flash-Vision: a ViT over each image's patches and the aligner that folds
// 3x3 patch blocks into language-model embeddings, written once against the Backend seam.
//
//   x = patch_embed(patches)                        Linear(3 p^2 -> dim) + bias, patches flattened (c, y, x)
//   per block (pre-RMSNorm, eps 1e-6):
//     q, k, v = wqkv(norm1(x))                      fused, with bias
//     q, k = rope2d(q), rope2d(k)                   rotate-half over the whole head; the first head_dim/4
//                                                   pair angles are the patch's row * inv_freq, the next
//                                                   head_dim/4 its column * inv_freq,
//                                                   inv_freq_i = theta^(-2i / (head_dim/2))
//     x += wo(softmax(q k^T / sqrt(head_dim)) v)    bidirectional, each image on its own; no CLS, no learned
//                                                   positions
//     x += w2(silu(w1_gate h) * w1_up h), h = norm2(x)
//   x = norm(x)
//   aligner: r x r blocks of the image's grid (zero-padded to multiples of r), features channel-major
//   (c*r*r + dy*r + dx) -> Linear(dim r^2 -> hidden) + bias -> exact GELU -> Linear(hidden -> hidden) + bias.
//
// Tensor parallelism (docs/vision.md): with weights loaded as a shard (VisionWeights::tower_world > 1) each
// rank runs its heads (wq/wk/wv column-parallel, wo row-parallel) and its SwiGLU columns (w1/w3
// column-parallel, w2 row-parallel), and the two row-parallel outputs of each block are summed over the
// ranks before they join the residual; the aligner likewise (w1 column-parallel, w2 row-parallel + sum).
// Every rank then holds the whole output.
//
// Where each fact comes from: docs/vision.md (vLLM's vllm/models/deepseek_v4/common/vision.py).
#pragma once

#include <cstdint>
#include <vector>

#include "common/communicator.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "common/vision/vision_config.h"
#include "model/weights.h"

namespace dsmesh {

// One image's ViT patch grid (rows x columns of patches).
struct VitGrid {
  int h = 0, w = 0;
};

// Aligner outputs of one image: ceil(h / r) * ceil(w / r).
int64_t AlignerRows(const VitGrid& grid, int downsample_ratio);

// The 2D RoPE angles of an h x w patch grid: [h*w, head_dim/2] (patches row-major), f32 as the reference
// computes them (inv_freq and position * inv_freq in float32).
std::vector<float> VisionRopeAngles(const VitGrid& grid, int head_dim, double theta);

// Runs the ViT over every image and the aligner over each image's grid. patches [sum h*w, 3*p*p] f32 in
// backend memory, the images' patches one after another (PreprocessedImage::patches). Returns
// [sum AlignerRows, hidden] f32 in backend memory: per image, its aligner grid row-major (the order before
// ImageBlock::perm places the rows in the prompt). `comm` sums the row-parallel partials of sharded
// weights (every rank of the split calls this with the same patches); it may be null when the weights are
// whole. Throws std::runtime_error when the weights are sharded over another world than comm's.
Tensor RunVisionTower(Backend& backend, const VisionConfig& config, const VisionWeights& weights,
                      const Tensor& patches, const std::vector<VitGrid>& grids, Communicator* comm = nullptr);

// The ViT alone (what the aligner reads): [sum h*w, dim]. Exposed for tests.
Tensor RunVit(Backend& backend, const VisionConfig& config, const VisionWeights& weights, const Tensor& patches,
              const std::vector<VitGrid>& grids, Communicator* comm = nullptr);

}  // namespace dsmesh

// DeepSeek-V4-Flash-Vision image preprocessing: decoded RGB pixels -> the ViT's normalized patches, the
// patch and aligner grids, and the image's token block in the prompt. Each rule follows vLLM's port of the
// official processor (vllm/models/deepseek_v4/common/mm_preprocess.py; docs/vision.md lists which function
// each fact comes from):
//   1. size: a side beyond max_wh_ratio * the other is clamped (width only), an image under min_pixels is
//      scaled up to it, both sides are rounded up to whole patches, then shrunk (solve_resize_ratio) until
//      the token block fits max_n_token - 3 (3 left for the compressor-alignment pad);
//   2. pixels: resized with Pillow's bicubic filter (bit-exact re-implementation of its fixed-point
//      two-pass resampler) - stretched to the exact size when width >= max_wh_ratio * height, otherwise
//      fitted inside it keeping the aspect ratio and centred on grey (127, 127, 127) (ImageOps.pad);
//   3. values: v / 255, then (v - 0.5) / 0.5 in float32, rounded to bfloat16;
//   4. patches: [n_vit_h * n_vit_w, 3, p, p], patches row-major, inside a patch channel, row, column;
//   5. block: IMAGE_START, then the aligner grid (n_llm_h x (n_llm_w + 1), each row ending in
//      IMAGE_NEWLINE, an odd row count padded with a row of IMAGE_PAD) read two rows at a time column by
//      column, IMAGE_PAD x2 when that count is odd, IMAGE_END; before it 3 - start % 4 IMAGE_PAD so the grid
//      starts on a multiple of 4 (the compressor ratio).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/image/image_decode.h"
#include "common/vision/vision_config.h"

namespace dsmesh {

// The grids one image gets.
struct ImageGrid {
  int best_width = 0, best_height = 0;  // the resized image (multiples of patch_size)
  int vit_h = 0, vit_w = 0;             // ViT patches
  int llm_h = 0, llm_w = 0;             // aligner outputs (ceil(vit / downsample_ratio))
  int block_tokens = 0;                 // the token block without the alignment pad
};

// The size rule (step 1) for an image of width x height pixels. Throws std::runtime_error for sizes the
// rule cannot place (zero sides).
ImageGrid PlanImageGrid(int width, int height, const VisionConfig& config);

// Step 2 on its own: Pillow's Image.resize(size, BICUBIC) of an RGB image (exposed for tests).
RgbImage ResizeBicubic(const RgbImage& in, int width, int height);

struct PreprocessedImage {
  ImageGrid grid;
  // [vit_h * vit_w, 3, p, p] values, each exactly representable in bfloat16 (the reference casts to bf16).
  std::vector<float> patches;
};

PreprocessedImage PreprocessImage(const RgbImage& image, const VisionConfig& config);

// Token types of an image block, and the ids vLLM gives them (five reserved in-vocab tokens,
// <|place_holder_mm_span_0431|> .. _0435|>: id = kImageSentinelBaseId + type).
enum ImageTokenType : int { kImageStart = 0, kImagePad = 1, kImageToken = 2, kImageNewline = 3, kImageEnd = 4 };
inline constexpr int kImageSentinelBaseId = 129257;
inline constexpr int kCompressPadTo = 4;

struct ImageBlock {
  std::vector<int> types;  // the whole block in prompt order, alignment pad first
  // For each kImageToken position in `types`, in order: the index of the aligner output (row-major over
  // llm_h x llm_w) that fills it.
  std::vector<int> perm;
};

// The block for an aligner grid of llm_h x llm_w placed at prompt position `start` (the pad before it is
// 3 - start % 4 tokens).
ImageBlock BuildImageBlock(int llm_h, int llm_w, int64_t start);

}  // namespace dsmesh

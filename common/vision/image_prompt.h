// The prompt layout of images (DeepSeek-V4-Flash-Vision): after the chat encoding has been tokenized, every
// image placeholder token becomes the image's sentinel block (common/vision/vision_preprocess.h BuildImageBlock):
// 3 - start % 4 IMAGE_PAD (so the grid starts on a multiple of the compressor ratio), IMAGE_START, the
// aligner grid's rows each ending in IMAGE_NEWLINE and read two rows at a time column by column, IMAGE_PAD
// where the layout needs them, IMAGE_END. Ids are kImageSentinelBaseId + type.
//
// This follows vLLM (common/mm_preprocess.py): the placeholder "<｜deepseek_image｜>" is one token of the
// vision model's tokenizer (PromptReplacement target [placeholder id]); the alignment pad is prepended at
// splice time, when the block's position in the final prompt is known (_apply_token_matches_with_placeholders).
// It lives beside BuildImageBlock rather than in common/chat because the block comes from the vision config.
#pragma once

#include <cstdint>
#include <vector>

#include "common/vision/vision_preprocess.h"

namespace dsmesh {

// Where one image landed in the expanded prompt.
struct ImageSpan {
  int64_t begin = 0, length = 0;       // the whole block, alignment pad included
  // Prompt positions of the block's IMAGE tokens in order; aligner output perm[i] (row-major over the
  // image's llm_h x llm_w grid) fills position embed_positions[i].
  std::vector<int64_t> embed_positions;
  std::vector<int> perm;
};

struct ExpandedPrompt {
  std::vector<int32_t> tokens;
  std::vector<ImageSpan> images;  // in placeholder order
};

// Replaces the i-th occurrence of placeholder_id in `tokens` by the block of image i, whose aligner grid
// is llm_grids[i] = {llm_h, llm_w}. Throws std::runtime_error when the number of placeholders differs from
// the number of images.
ExpandedPrompt ExpandImagePlaceholders(const std::vector<int32_t>& tokens, int32_t placeholder_id,
                                       const std::vector<std::pair<int, int>>& llm_grids);

}  // namespace dsmesh

// A chat prompt with images as the mesh runs it (DeepSeek-V4-Flash-Vision; docs/vision.md): the rendered
// prompt's image placeholders (common/chat kImagePlaceholder, one per image part) become each image's
// sentinel block in the token ids, and each image's preprocessed patches travel beside them
// (proto PromptImage) for the worker's tower.
#pragma once

#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gateway/image_inputs.h"
#include "common/vision/vision_config.h"
#include "proto/mesh.pb.h"

namespace dsmesh {

struct ImagePrompt {
  std::vector<int> prompt_ids;
  std::vector<PromptImage> images;
};

// The placeholders split `rendered`; the pieces are tokenized on their own (the real vision tokenizer has
// the placeholder as one special token, so no token crosses it) and each placeholder is replaced by its
// image's block. Throws ApiError(400) when the placeholder count differs from the image count (a
// placeholder typed in the text) or the vocabulary lacks the sentinel ids.
ImagePrompt BuildImagePrompt(const std::string& rendered, const std::vector<ChatImage>& images,
                             const Tokenizer& tokenizer, const VisionConfig& vision);

}  // namespace dsmesh

#include "common/vision/image_prompt.h"

#include <stdexcept>
#include <string>

namespace dsmesh {

ExpandedPrompt ExpandImagePlaceholders(const std::vector<int32_t>& tokens, int32_t placeholder_id,
                                       const std::vector<std::pair<int, int>>& llm_grids) {
  size_t placeholders = 0;
  for (int32_t t : tokens) placeholders += t == placeholder_id;
  if (placeholders != llm_grids.size())
    throw std::runtime_error("prompt has " + std::to_string(placeholders) + " image placeholders for " +
                             std::to_string(llm_grids.size()) + " images");
  ExpandedPrompt out;
  for (int32_t t : tokens) {
    if (t != placeholder_id) {
      out.tokens.push_back(t);
      continue;
    }
    const auto [llm_h, llm_w] = llm_grids[out.images.size()];
    ImageSpan span;
    span.begin = static_cast<int64_t>(out.tokens.size());
    const ImageBlock block = BuildImageBlock(llm_h, llm_w, span.begin);  // the pad depends on where it starts
    for (int type : block.types) {
      if (type == kImageToken) span.embed_positions.push_back(static_cast<int64_t>(out.tokens.size()));
      out.tokens.push_back(kImageSentinelBaseId + type);
    }
    span.length = static_cast<int64_t>(block.types.size());
    span.perm = block.perm;
    out.images.push_back(std::move(span));
  }
  return out;
}

}  // namespace dsmesh

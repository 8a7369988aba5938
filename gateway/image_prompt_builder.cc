#include "gateway/image_prompt_builder.h"

#include <cstring>
#include <string_view>

#include "common/chat/chat_request.h"
#include "gateway/api_error.h"
#include "common/vision/image_prompt.h"
#include "common/vision/vision_preprocess.h"

namespace dsmesh {

ImagePrompt BuildImagePrompt(const std::string& rendered, const std::vector<ChatImage>& images,
                             const Tokenizer& tokenizer, const VisionConfig& vision) {
  if (tokenizer.vocab_size() < kImageSentinelBaseId + 5)
    throw BadRequest("the model's vocabulary (" + std::to_string(tokenizer.vocab_size()) +
                         " ids) has no image sentinel tokens",
                     "messages", std::string("images_not_supported"));
  constexpr int32_t kMarker = -1;  // where an image goes, until ExpandImagePlaceholders replaces it
  const std::string_view placeholder = kImagePlaceholder;
  std::vector<int32_t> ids;
  size_t from = 0;
  for (;;) {
    const size_t at = rendered.find(placeholder, from);
    const std::string_view piece = std::string_view(rendered).substr(from, at == std::string::npos ? std::string::npos : at - from);
    for (int32_t id : tokenizer.Encode(piece, /*add_special_tokens=*/false)) ids.push_back(id);
    if (at == std::string::npos) break;
    ids.push_back(kMarker);
    from = at + placeholder.size();
  }
  std::vector<PreprocessedImage> pre;
  std::vector<std::pair<int, int>> grids;
  for (const ChatImage& image : images) {
    try {
      pre.push_back(PreprocessImage(image.image, vision));
    } catch (const std::exception& e) {
      throw BadRequest(image.param + ": " + e.what(), image.param, std::string("invalid_image"));
    }
    grids.push_back({pre.back().grid.llm_h, pre.back().grid.llm_w});
  }
  ExpandedPrompt expanded;
  try {
    expanded = ExpandImagePlaceholders(ids, kMarker, grids);
  } catch (const std::exception& e) {
    throw BadRequest(std::string(e.what()) + " (is " + std::string(placeholder) + " typed in a text part?)", "messages");
  }
  ImagePrompt out;
  out.prompt_ids.assign(expanded.tokens.begin(), expanded.tokens.end());
  for (size_t i = 0; i < images.size(); ++i) {
    const ImageSpan& span = expanded.images[i];
    PromptImage im;
    im.set_begin(span.begin);
    im.set_length(static_cast<int32_t>(span.length));
    im.set_vit_h(pre[i].grid.vit_h);
    im.set_vit_w(pre[i].grid.vit_w);
    for (int p : span.perm) im.add_perm(p);
    im.set_patches(std::string(reinterpret_cast<const char*>(pre[i].patches.data()),
                               pre[i].patches.size() * sizeof(float)));
    out.images.push_back(std::move(im));
  }
  return out;
}

}  // namespace dsmesh

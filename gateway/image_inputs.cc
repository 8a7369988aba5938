#include "gateway/image_inputs.h"

#include "gateway/api_error.h"

namespace dsmesh {

std::vector<ChatImage> DecodeChatImages(const ChatRequest& request, const ImageInputOptions& options) {
  size_t count = 0;
  for (const auto& m : request.messages) count += m.images.size();
  if (count > static_cast<size_t>(options.max_images))
    throw BadRequest("the request has " + std::to_string(count) + " images; at most " +
                         std::to_string(options.max_images) + " are accepted per request",
                     "messages");
  std::vector<ChatImage> out;
  for (const auto& m : request.messages) {
    for (const auto& part : m.images) {
      try {
        out.push_back(ChatImage{part.param, DecodeImageUrl(part.url, options.url)});
      } catch (const ImageError& e) {
        throw BadRequest(part.param + ": " + e.what(), part.param, std::string("invalid_image"));
      }
    }
  }
  return out;
}

void RefuseImages(const ChatRequest& request, const std::string& model, const std::string& reason) {
  std::string param = "messages";
  for (const auto& m : request.messages)
    if (!m.images.empty()) {
      param = m.images.front().param;
      break;
    }
  throw BadRequest("model `" + model + "` does not accept images: " + reason, param,
                   std::string("images_not_supported"));
}

}  // namespace dsmesh

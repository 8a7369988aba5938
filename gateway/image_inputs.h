// Image inputs of a chat request: each image_url part decoded (common/image) under the gateway's limits,
// every failure an HTTP 400 whose param names the content part ("messages[0].content[1].image_url").
// The decoded images are what a vision model's preprocessing (common/vision/vision_preprocess.h) consumes; a
// model without a vision path refuses them with a 400 of its own (RefuseImages).
#pragma once

#include <string>
#include <vector>

#include "common/chat/chat_request.h"
#include "common/image/image_url.h"

namespace dsmesh {

struct ImageInputOptions {
  ImageUrlOptions url;     // --allowed-local-media-path, --max-image-bytes/-pixels/-side
  int max_images = 8;      // --max-images-per-request
};

struct ChatImage {
  std::string param;  // the content part it came from
  RgbImage image;
};

// Decodes every image part of `request`, in message and part order. Throws ApiError(400).
std::vector<ChatImage> DecodeChatImages(const ChatRequest& request, const ImageInputOptions& options);

// The 400 for a request with images to a model that cannot take them; `reason` ends the message.
[[noreturn]] void RefuseImages(const ChatRequest& request, const std::string& model, const std::string& reason);

}  // namespace dsmesh

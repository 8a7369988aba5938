// An OpenAI `image_url.url` -> decoded pixels. Accepted:
//   data:image/png;base64,...   data:image/jpeg;base64,... (image/jpg too)   data:image/webp;base64,...
//     strict base64 (standard alphabet, '=' padding, no whitespace, as vLLM's b64decode(validate=True));
//     the declared type must match the data's magic bytes;
//   file:///path                only when the gateway was given --allowed-local-media-path DIR and the
//                               path (symlinks resolved) lies inside DIR; regular files only.
// Refused: http(s) URLs (the gateway fetches nothing over the network), other schemes, other media types.
// Every refusal is an ImageError whose message says why and what to send instead.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/image/image_decode.h"

namespace dsmesh {

struct ImageUrlOptions {
  std::string allowed_local_media_path;  // empty: file URLs are refused
  ImageLimits limits;
};

// Strict base64 (RFC 4648 standard alphabet with padding). Throws ImageError naming the first bad offset.
std::string DecodeBase64Strict(std::string_view text);

struct ImageBytes {
  std::string bytes;
  std::optional<ImageFormat> declared;  // from a data: URL's media type; nullopt for files
};

// The encoded image a URL names (no decoding yet). Throws ImageError.
ImageBytes LoadImageUrl(std::string_view url, const ImageUrlOptions& options);

// LoadImageUrl + DecodeImage, checking the declared type against the data. Throws ImageError.
RgbImage DecodeImageUrl(std::string_view url, const ImageUrlOptions& options);

}  // namespace dsmesh

#include "common/image/image_url.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <system_error>

namespace dsmesh {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && Lower(s.substr(0, prefix.size())) == prefix;
}

int Base64Value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

std::optional<ImageFormat> FormatForMediaType(const std::string& type) {
  if (type == "image/png") return ImageFormat::kPng;
  if (type == "image/jpeg" || type == "image/jpg") return ImageFormat::kJpeg;
  if (type == "image/webp") return ImageFormat::kWebp;
  return std::nullopt;
}

ImageBytes LoadDataUrl(std::string_view url, const ImageUrlOptions& options) {
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) throw ImageError("the data: URL has no ',' before its data");
  std::string_view header = url.substr(5, comma - 5);  // after "data:"
  std::string_view payload = url.substr(comma + 1);
  const size_t semi = header.find(';');
  const std::string type = Lower(header.substr(0, semi));
  bool base64 = false;
  for (size_t at = semi; at != std::string_view::npos;) {
    const size_t next = header.find(';', at + 1);
    std::string param = Lower(header.substr(at + 1, next == std::string_view::npos ? std::string_view::npos : next - at - 1));
    if (param == "base64") base64 = true;
    at = next;
  }
  if (type.empty())
    throw ImageError("the data: URL declares no media type; use data:image/png;base64,... (or image/jpeg, image/webp)");
  auto declared = FormatForMediaType(type);
  if (!declared)
    throw ImageError("media type '" + type + "' is not supported; send image/png, image/jpeg or image/webp");
  if (!base64) throw ImageError("the data: URL must be base64 (data:" + type + ";base64,...)");
  // Refuse before decoding what cannot fit: 4 characters carry 3 bytes.
  if (payload.size() / 4 * 3 > options.limits.max_bytes + 2)
    throw ImageError("the image is about " + std::to_string(payload.size() / 4 * 3) + " bytes; at most " +
                     std::to_string(options.limits.max_bytes) + " are accepted");
  ImageBytes out;
  out.bytes = DecodeBase64Strict(payload);
  out.declared = declared;
  return out;
}

std::string PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + 1])) ||
          !std::isxdigit(static_cast<unsigned char>(s[i + 2])))
        throw ImageError("the file URL has a malformed %-escape");
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  if (out.find('\0') != std::string::npos) throw ImageError("the file URL holds a NUL byte");
  return out;
}

ImageBytes LoadFileUrl(std::string_view url, const ImageUrlOptions& options) {
  if (options.allowed_local_media_path.empty())
    throw ImageError("local files are not served: start the gateway with --allowed-local-media-path DIR to allow "
                     "file:// URLs under DIR, or send the image as a data: URL");
  std::string_view rest = url.substr(7);  // after "file://"
  if (StartsWithNoCase(rest, "localhost/")) rest.remove_prefix(9);
  if (rest.empty() || rest[0] != '/') throw ImageError("the file URL must be file:///absolute/path");
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root = fs::canonical(options.allowed_local_media_path, ec);
  if (ec) throw ImageError("the allowed local media path is not readable");
  const fs::path path = fs::canonical(fs::path(PercentDecode(rest)), ec);
  if (ec) throw ImageError("no such file under the allowed local media path");
  const fs::path rel = path.lexically_relative(root);
  if (rel.empty() || *rel.begin() == "..")
    throw ImageError("the file is outside the allowed local media path");
  // O_NONBLOCK: a FIFO swapped in after the check cannot block the open; fstat then requires a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw ImageError("the file cannot be opened");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ImageError("the path is not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > options.limits.max_bytes) {
    ::close(fd);
    throw ImageError("the image is " + std::to_string(st.st_size) + " bytes; at most " +
                     std::to_string(options.limits.max_bytes) + " are accepted");
  }
  ImageBytes out;
  out.bytes.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.bytes.size()) {
    const ssize_t n = ::read(fd, out.bytes.data() + got, out.bytes.size() - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.bytes.resize(got);
  return out;
}

}  // namespace

std::string DecodeBase64Strict(std::string_view text) {
  if (text.size() % 4 != 0)
    throw ImageError("invalid base64 in the data: URL: its length (" + std::to_string(text.size()) +
                     ") is not a multiple of 4");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const unsigned char c = static_cast<unsigned char>(text[i + k]);
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[k] = Base64Value(c)) < 0)
        throw ImageError("invalid base64 in the data: URL at offset " + std::to_string(i + k));
    }
    const uint32_t triple = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out += static_cast<char>((triple >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((triple >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(triple & 0xff);
  }
  return out;
}

ImageBytes LoadImageUrl(std::string_view url, const ImageUrlOptions& options) {
  if (url.empty()) throw ImageError("the image URL is empty");
  if (StartsWithNoCase(url, "data:")) return LoadDataUrl(url, options);
  if (StartsWithNoCase(url, "file://")) return LoadFileUrl(url, options);
  if (StartsWithNoCase(url, "http://") || StartsWithNoCase(url, "https://"))
    throw ImageError("image URLs over http(s) are not fetched (this gateway makes no network requests); send the "
                     "image inline as a data: URL (data:image/png;base64,...)");
  const size_t colon = url.find(':');
  if (colon != std::string_view::npos && colon < 16)
    throw ImageError("image URL scheme '" + std::string(url.substr(0, colon)) +
                     "' is not supported; send a data: URL (data:image/png;base64,...)");
  throw ImageError("the image URL must be a data: URL (data:image/png;base64,...)");
}

RgbImage DecodeImageUrl(std::string_view url, const ImageUrlOptions& options) {
  ImageBytes loaded = LoadImageUrl(url, options);
  if (loaded.bytes.empty()) throw ImageError("the image data is empty");
  auto found = SniffImageFormat(loaded.bytes);
  if (!found) throw ImageError("the data is not a PNG, JPEG or WebP image");
  if (loaded.declared && *loaded.declared != *found)
    throw ImageError(std::string("the data: URL declares ") + ImageFormatMime(*loaded.declared) + " but the data is " +
                     ImageFormatName(*found));
  return DecodeImage(loaded.bytes, options.limits);
}

}  // namespace dsmesh

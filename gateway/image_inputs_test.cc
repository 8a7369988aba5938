#include "gateway/image_inputs.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/chat/chat_request_parser.h"
#include "gateway/api_error.h"
#include "gateway/request_schema.h"

namespace dsmesh {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= uint8_t(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= uint8_t(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

ChatRequest WithImages(const std::vector<std::string>& urls) {
  nlohmann::ordered_json parts = nlohmann::ordered_json::array({{{"type", "text"}, {"text", "look"}}});
  for (const auto& u : urls) parts.push_back({{"type", "image_url"}, {"image_url", {{"url", u}}}});
  nlohmann::ordered_json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "user"}, {"content", parts}}}}};
  return ParseChatRequest(body);
}

ApiError ErrorOf(const ChatRequest& r, const ImageInputOptions& options = {}) {
  try {
    DecodeChatImages(r, options);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(200, "", "");
}

const std::string kPng = "data:image/png;base64," + Base64(ReadFile("common/image/testdata/rgb.png"));
const std::string kJpg = "data:image/jpeg;base64," + Base64(ReadFile("common/image/testdata/rgb.jpg"));

TEST(ImageInputsTest, DecodesEveryPartInOrder) {
  auto images = DecodeChatImages(WithImages({kPng, kJpg}), {});
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0].param, "messages[1].content[1].image_url");
  EXPECT_EQ(images[1].param, "messages[1].content[2].image_url");
  EXPECT_EQ(images[0].image.width, 37);
  EXPECT_EQ(images[1].image.height, 23);
}

TEST(ImageInputsTest, ErrorsNameThePart) {
  ApiError e = ErrorOf(WithImages({kPng, "data:image/png;base64," + kJpg.substr(23)}));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages[1].content[2].image_url");
  EXPECT_EQ(e.code, "invalid_image");
  EXPECT_STREQ(e.what(), "messages[1].content[2].image_url: the data: URL declares image/png but the data is JPEG");

  e = ErrorOf(WithImages({"https://example.com/cat.png"}));
  EXPECT_EQ(e.param, "messages[1].content[1].image_url");
  EXPECT_NE(std::string(e.what()).find("not fetched"), std::string::npos);

  ImageInputOptions small;
  small.url.limits.max_pixels = 100;
  e = ErrorOf(WithImages({kJpg}), small);
  EXPECT_STREQ(e.what(), "messages[1].content[1].image_url: JPEG image is 37 x 23 = 851 pixels; at most 100 are accepted");

  // A truncated image, cut at a 3-byte boundary so the base64 stays valid.
  std::string png = ReadFile("common/image/testdata/rgb.png");
  e = ErrorOf(WithImages({"data:image/png;base64," + Base64(png.substr(0, png.size() / 3 * 3 - 30))}));
  EXPECT_EQ(e.param, "messages[1].content[1].image_url");
  EXPECT_NE(std::string(e.what()).find("invalid PNG data"), std::string::npos) << e.what();
}

TEST(ImageInputsTest, TooManyImages) {
  ImageInputOptions options;
  options.max_images = 1;
  ApiError e = ErrorOf(WithImages({kPng, kPng}), options);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages");
  EXPECT_STREQ(e.what(), "the request has 2 images; at most 1 are accepted per request");
}

TEST(ImageInputsTest, RefusalNamesTheModelAndTheFirstImage) {
  try {
    RefuseImages(WithImages({kPng}), "tiny", "it has no vision tower");
    FAIL() << "no throw";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_STREQ(e.what(), "model `tiny` does not accept images: it has no vision tower");
    EXPECT_EQ(e.param, "messages[1].content[1].image_url");
    EXPECT_EQ(e.code, "images_not_supported");
  }
}

TEST(ImageInputsTest, ParserErrorsMapToThePart) {
  EXPECT_EQ(ChatErrorParam("messages[0].content[1].image_url.url must be a string"), "messages[0].content[1].image_url");
  EXPECT_EQ(ChatErrorParam("messages[3].content[0].image_url must be an object {\"url\": ...}"),
            "messages[3].content[0].image_url");
  EXPECT_EQ(ChatErrorParam("messages[0].content[0]: image parts are only allowed in user messages, not 'system'"),
            "messages");
  EXPECT_EQ(ChatErrorParam("messages[2].role must be a string"), "messages");
  EXPECT_EQ(ChatErrorParam("tools[0].function must be an object"), "tools");
}

}  // namespace
}  // namespace dsmesh

// Streaming detokenization: pieces concatenate to the full decode for every corpus line and for
// random id sequences (which produce broken UTF-8); stop strings are caught across token and
// character boundaries and never emitted.
#include "common/tokenizer/incremental_detokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "common/tokenizer/testing/reference_runner.h"
#include "common/tokenizer/testing/test_corpus.h"

namespace dsmesh {
namespace {

std::shared_ptr<const Tokenizer> V4() {
  static auto t = Tokenizer::Load(testing::DeepSeekV4TokenizerDir());
  return t;
}

std::string Stream(const std::vector<int32_t>& ids, std::vector<std::string> stops = {}, bool skip = false,
                   bool* stopped = nullptr) {
  IncrementalDetokenizer d(V4(), std::move(stops), skip);
  std::string out;
  for (int32_t id : ids) out += d.Push(id);
  out += d.Flush();
  if (stopped) *stopped = d.stopped();
  return out;
}

TEST(IncrementalDetokenizer, ConcatenationEqualsDecodeOnCorpus) {
  const auto corpus = testing::GenerateTokenizerCorpus();
  size_t failures = 0;
  for (const auto& item : corpus) {
    const auto ids = V4()->Encode(item.text);
    if (Stream(ids) != V4()->Decode(ids) || Stream(ids, {}, true) != V4()->Decode(ids, true)) {
      if (failures++ < 5) ADD_FAILURE() << "stream differs from decode for a " << item.category << " item";
    }
  }
  EXPECT_EQ(failures, 0u);
}

TEST(IncrementalDetokenizer, ConcatenationEqualsDecodeOnRandomIds) {
  std::mt19937 rng(11);
  // Byte tokens (ids of single bytes) make invalid and split UTF-8 likely.
  std::vector<int32_t> pool;
  for (int b = 0; b < 256; ++b) pool.push_back(V4()->Encode(std::string(1, char(b & 0x7F)))[0]);
  for (const char* s : {"æ", "Ĺ", "¥", "ð", "Ł", "Ģ", "ã", "ģ", "Ĥ"}) pool.push_back(*V4()->TokenToId(s));
  for (int32_t id : {0, 1, 128803, 128821, 128822, 128825}) pool.push_back(id);
  for (int i = 0; i < 20000; ++i) {
    std::vector<int32_t> ids;
    const int n = 1 + int(rng() % 24);
    for (int k = 0; k < n; ++k) ids.push_back(rng() % 3 ? pool[rng() % pool.size()] : int32_t(rng() % 129280));
    ASSERT_EQ(Stream(ids), V4()->Decode(ids));
    ASSERT_EQ(Stream(ids, {}, true), V4()->Decode(ids, true));
  }
}

TEST(IncrementalDetokenizer, HoldsIncompleteCharacters) {
  const auto e6 = *V4()->TokenToId("æ"), x97 = *V4()->TokenToId("Ĺ"), a5 = *V4()->TokenToId("¥");
  IncrementalDetokenizer d(V4());
  EXPECT_EQ(d.Push(e6), "");
  EXPECT_EQ(d.Push(x97), "");
  EXPECT_EQ(d.Push(a5), "日");
  EXPECT_EQ(d.Push(e6), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizer, StopStringAcrossTokensIsNotEmitted) {
  const std::string text = "The answer is 42.\nUser: next question";
  const auto ids = V4()->Encode(text);
  IncrementalDetokenizer d(V4(), {"\nUser:"});
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = d.Push(id);
    EXPECT_EQ(piece.find("User"), std::string::npos);
    out += piece;
  }
  out += d.Flush();
  EXPECT_TRUE(d.stopped());
  EXPECT_EQ(d.matched_stop(), "\nUser:");
  EXPECT_EQ(out, "The answer is 42.");
  EXPECT_EQ(d.Push(ids[0]), "");
}

TEST(IncrementalDetokenizer, StopStringInsideMultibyteCharacters) {
  // "世界" is split into byte tokens by feeding the bytes one token per byte.
  std::vector<int32_t> ids = V4()->Encode("你好");
  for (unsigned char b : std::string("世界!")) {
    std::string spelled;
    for (int32_t id = 0; id < V4()->vocab_size(); ++id)
      if (!V4()->IsAdded(id) && V4()->TokenBytes(id) == std::string(1, char(b))) {
        ids.push_back(id);
        break;
      }
  }
  bool stopped = false;
  EXPECT_EQ(Stream(ids, {"界"}, false, &stopped), "你好世");
  EXPECT_TRUE(stopped);
}

TEST(IncrementalDetokenizer, HeldPrefixIsReleasedWhenItIsNotAStop) {
  IncrementalDetokenizer d(V4(), {"</think>x", "STOP"});
  std::string out;
  for (int32_t id : V4()->Encode("abc</think>yST")) out += d.Push(id);
  EXPECT_EQ(out, "abc</think>y");  // "ST" may still become STOP
  EXPECT_EQ(d.Flush(), "ST");
  EXPECT_FALSE(d.stopped());
}

TEST(IncrementalDetokenizer, RandomStopStringsOnCorpus) {
  std::mt19937_64 rng(5);
  const auto corpus = testing::GenerateTokenizerCorpus(300000, 99);
  for (const auto& item : corpus) {
    const auto ids = V4()->Encode(item.text);
    const std::string full = V4()->Decode(ids);
    if (full.size() < 4) continue;
    // A stop string taken from the text (on character boundaries), plus one that never occurs.
    size_t a = rng() % full.size(), len = 1 + rng() % 6;
    while (a > 0 && (static_cast<unsigned char>(full[a]) & 0xC0) == 0x80) --a;
    size_t b = std::min(full.size(), a + len);
    while (b < full.size() && (static_cast<unsigned char>(full[b]) & 0xC0) == 0x80) ++b;
    const std::string stop = full.substr(a, b - a);
    bool stopped = false;
    const std::string out = Stream(ids, {stop, "\x01never\x02"}, false, &stopped);
    ASSERT_TRUE(stopped);
    ASSERT_EQ(out, full.substr(0, full.find(stop))) << item.category;
  }
}

}  // namespace
}  // namespace dsmesh

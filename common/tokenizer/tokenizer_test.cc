// Unit tests of Tokenizer on the real DeepSeek files: known ids, special tokens, UTF-8 errors,
// round trips, load errors, added-token flags (checked against the JS reference), thread safety.
#include "common/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/testing/reference_runner.h"
#include "common/tokenizer/utf8.h"

namespace dsmesh {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const Tokenizer> V3() {
  static auto t = Tokenizer::Load(testing::DeepSeekV3TokenizerDir());
  return t;
}
std::shared_ptr<const Tokenizer> V4() {
  static auto t = Tokenizer::Load(testing::DeepSeekV4TokenizerDir());
  return t;
}

TEST(Tokenizer, KnownIds) {
  // Expected ids published with the DeepSeek tokenizer (also what @lenml/tokenizers gives).
  const std::vector<int32_t> expected = {19923, 3,     223,   5464, 5008,  1175, 19,    940,   223,
                                         19,    438,   223,   20,   6113,  257,  76589, 131,   100,
                                         76032, 1628,  76589, 131,  108,   76589, 131,   98};
  EXPECT_EQ(V3()->Encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"), expected);
  EXPECT_EQ(V4()->Encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"), expected);
}

TEST(Tokenizer, V4PromptTokens) {
  const std::string prompt = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
  const std::vector<int32_t> expected = {128803, 30594, 128804, 128821, 36101, 128822, 7624, 1};
  EXPECT_EQ(V4()->Encode(prompt), expected);
  EXPECT_EQ(V4()->Decode(expected), prompt);
  // V3 has no <think> token: the same text is split by BPE there.
  EXPECT_GT(V3()->Encode("<think>").size(), 1u);
  EXPECT_EQ(V4()->Encode("<think>"), std::vector<int32_t>{128821});
}

TEST(Tokenizer, Vocabulary) {
  EXPECT_EQ(V3()->vocab_size(), 128815);
  EXPECT_EQ(V4()->vocab_size(), 129280);
  EXPECT_EQ(V4()->bos_id(), 0);
  EXPECT_EQ(V4()->eos_id(), 1);
  EXPECT_EQ(V4()->TokenToId("<｜User｜>"), 128803);
  EXPECT_EQ(V4()->IdToToken(128822), "</think>");
  const auto the = V3()->TokenToId("Ġthe");
  ASSERT_TRUE(the.has_value());
  EXPECT_EQ(V3()->IdToToken(*the), "Ġthe");
  EXPECT_EQ(V3()->TokenBytes(*the), " the");
  EXPECT_FALSE(V3()->TokenToId("no such token").has_value());
  EXPECT_TRUE(V4()->IsSpecial(0));
  EXPECT_FALSE(V4()->IsSpecial(128803));  // <｜User｜> is an added token but not "special"
  EXPECT_TRUE(V4()->IsAdded(128803));
  EXPECT_THROW(V4()->IdToToken(129280), std::out_of_range);
  EXPECT_THROW(V4()->IdToToken(-1), std::out_of_range);
}

TEST(Tokenizer, AddSpecialTokensFollowsConfig) {
  const auto plain = V3()->Encode("hi there");
  auto with = plain;
  with.insert(with.begin(), 0);  // add_bos_token: true, add_eos_token: false
  EXPECT_EQ(V3()->Encode("hi there", true), with);
  // Special-token strings in the text are recognized either way.
  EXPECT_EQ(V3()->Encode("<｜end▁of▁sentence｜>"), std::vector<int32_t>{1});
}

TEST(Tokenizer, DecodeSkipsOnlySpecialTokens) {
  const auto ids = V4()->Encode("<｜begin▁of▁sentence｜><｜User｜>hi<｜end▁of▁sentence｜>");
  EXPECT_EQ(V4()->Decode(ids, /*skip_special_tokens=*/true), "<｜User｜>hi");
  EXPECT_THROW(V4()->Decode({5, 999999}), std::out_of_range);
  try {
    V4()->Decode({-3});
    FAIL();
  } catch (const std::out_of_range& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("-3"));
  }
}

TEST(Tokenizer, InvalidUtf8IsRejectedWithOffset) {
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"ab\xFF" "cd", 2},         {"\xC3", 0},             {"ok\xC0\xAF", 2},  // overlong
      {"x\xED\xA0\x80", 1},       // surrogate
      {"\xF4\x90\x80\x80", 0},    // above U+10FFFF
      {"日本\xE6\x97", 6},         // truncated at the end
      {"a\x80", 1},               // stray continuation
  };
  for (const auto& [text, offset] : cases) {
    try {
      V4()->Encode(text);
      ADD_FAILURE() << "accepted invalid UTF-8 at " << offset;
    } catch (const InvalidUtf8Error& e) {
      EXPECT_THAT(std::string(e.what()), HasSubstr("byte offset " + std::to_string(offset)));
    }
  }
}

TEST(Tokenizer, LossyDecodeOfPartialCharacters) {
  // Byte tokens of the first two bytes of 日 (E6 97 A5), then 'a': one U+FFFD for the cut sequence.
  const auto e6 = V4()->TokenToId("æ"), x97 = V4()->TokenToId("Ĺ"), a = V4()->TokenToId("a");
  ASSERT_TRUE(e6 && x97 && a);
  EXPECT_EQ(V4()->TokenBytes(*e6), "\xE6");
  EXPECT_EQ(V4()->TokenBytes(*x97), "\x97");
  EXPECT_EQ(V4()->Decode({*e6, *x97, *a}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(V4()->Decode({*e6, *x97}), "\xEF\xBF\xBD");
  EXPECT_EQ(V4()->Decode({*x97, *x97}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // An added token ends a byte run: the unfinished character before it is final.
  EXPECT_EQ(V4()->Decode({*e6, 128821}), "\xEF\xBF\xBD<think>");
}

TEST(Tokenizer, RoundTripsRandomValidUtf8) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const int len = int(rng() % 64);
    for (int k = 0; k < len; ++k) {
      char32_t c;
      switch (rng() % 4) {
        case 0: c = char32_t(rng() % 0x80); break;
        case 1: c = char32_t(rng() % 0x800); break;
        case 2: c = char32_t(rng() % 0x10000); break;
        default: c = char32_t(rng() % 0x110000); break;
      }
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      utf8::AppendCodePoint(c, &s);
    }
    ASSERT_EQ(V4()->Decode(V4()->Encode(s)), s);
  }
}

TEST(Tokenizer, VeryLongInputs) {
  for (const std::string& s : {std::string(300000, ' ') + "x", std::string(200000, 'a'), std::string(100000, '7'),
                               std::string(120000, '\n')}) {
    const auto ids = V4()->Encode(s);
    EXPECT_EQ(V4()->Decode(ids), s);
  }
}

TEST(Tokenizer, ConcurrentEncodingIsConsistent) {
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("Line " + std::to_string(i) + ": the quick brown fox 狐狸 " + std::to_string(i * 7919));
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(V4()->Encode(t));
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          if (V4()->Encode(texts[i]) != expected[i]) ++bad;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(Tokenizer, RegexClassesFollowEcmaScript) {
  const std::string p = PreTokenizer::TranslatePattern("\\s+(?!\\S)|[^\\s\\p{L}]", "test");
  EXPECT_THAT(p, HasSubstr("\\x{FEFF}"));
  EXPECT_THAT(p, HasSubstr("[^\\t"));
  EXPECT_THROW(PreTokenizer::TranslatePattern("[\\S]", "test"), std::runtime_error);
  EXPECT_THROW(PreTokenizer::TranslatePattern("\\bword", "test"), std::runtime_error);
}

// --- Load errors --------------------------------------------------------------------------------

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// A small byte-level BPE tokenizer.json: 256 byte tokens, a few merges, the given added tokens.
nlohmann::json TinyTokenizer(const nlohmann::json& added_tokens) {
  nlohmann::json vocab = nlohmann::json::object();
  int next = 0;
  // Build via the Tokenizer's own alphabet helper would hide mistakes; spell it out instead.
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    std::string s;
    utf8::AppendCodePoint(printable ? char32_t(b) : char32_t(256 + shifted++), &s);
    vocab[s] = next++;
  }
  vocab["he"] = next++;
  vocab["ll"] = next++;
  vocab["hell"] = next++;
  vocab["hello"] = next++;
  vocab["Ġw"] = next++;
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", added_tokens},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", " ?\\p{L}+| ?\\p{N}+|\\s+(?!\\S)|\\s+|[^\\s\\p{L}\\p{N}]+"}}},
           {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
        {"merges", {"h e", "l l", "he ll", "hell o", "Ġ w"}}}}};
  return j;
}

nlohmann::json Added(int id, const std::string& content, bool lstrip, bool rstrip, bool single_word) {
  return {{"id", id},         {"content", content},         {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", false},        {"special", true}};
}

TEST(Tokenizer, LoadErrorsNameTheFileAndProblem) {
  const std::string dir = testing::ScratchDir("tokenizer_load_errors");
  try {
    Tokenizer::Load(dir + "/missing");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr(dir + "/missing"));
  }
  const std::string bad_json = WriteFile(dir + "/bad_json", "tokenizer.json", "{\"model\": [1, 2");
  EXPECT_THROW(Tokenizer::Load(bad_json), std::runtime_error);
  nlohmann::json wp = TinyTokenizer(nlohmann::json::array());
  wp["model"]["type"] = "WordPiece";
  try {
    Tokenizer::Load(WriteFile(dir + "/wordpiece", "tokenizer.json", wp.dump()));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("model.type"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("wordpiece/tokenizer.json"));
  }
  nlohmann::json bad_merge = TinyTokenizer(nlohmann::json::array());
  bad_merge["model"]["merges"].push_back("x yz");
  try {
    Tokenizer::Load(WriteFile(dir + "/bad_merge", "tokenizer.json", bad_merge.dump()));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("x yz"));
  }
  nlohmann::json norm = TinyTokenizer(nlohmann::json::array());
  norm["normalizer"] = {{"type", "NFC"}};
  EXPECT_THROW(Tokenizer::Load(WriteFile(dir + "/nfc", "tokenizer.json", norm.dump())), std::runtime_error);
}

TEST(Tokenizer, TinyTokenizerMergesByRank) {
  const std::string dir = testing::ScratchDir("tokenizer_tiny");
  const auto tok = Tokenizer::Load(WriteFile(dir, "tokenizer.json", TinyTokenizer(nlohmann::json::array()).dump()));
  // "hello" -> h e l l o -> he ll -> hell -> hello (ranks 0..3); " w" -> Ġw.
  EXPECT_EQ(tok->Encode("hello"), std::vector<int32_t>{259});
  EXPECT_EQ(tok->Encode(" w").size(), 1u);
  EXPECT_EQ(tok->Decode(tok->Encode("hello world, héllo")), "hello world, héllo");
}

// lstrip / rstrip against the reference (which implements them); single_word by HF's rule (the
// reference ignores single_word).
TEST(Tokenizer, AddedTokenStripFlagsMatchReference) {
  const std::string dir = testing::ScratchDir("tokenizer_strip");
  const nlohmann::json added = {Added(261, "<L>", true, false, false), Added(262, "<R>", false, true, false),
                                Added(263, "<B>", true, true, false)};
  WriteFile(dir, "tokenizer.json", TinyTokenizer(added).dump());
  const auto tok = Tokenizer::Load(dir);
  const std::vector<std::string> texts = {"a <L> b", "a <R> b", "a\t\n<B>\u3000 b", " <L><R> ", "x<L>", "<R>y",
                                          "  <B>  <B>  ", "hello <L>\u00A0world <R>\uFEFFhello"};
  const auto ref = testing::ReferenceEncode(dir, texts);
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(tok->Encode(texts[i]), ref.ids[i]) << texts[i];
}

TEST(Tokenizer, SingleWordTokensDoNotMatchInsideWords) {
  const std::string dir = testing::ScratchDir("tokenizer_single_word");
  const auto tok =
      Tokenizer::Load(WriteFile(dir, "tokenizer.json", TinyTokenizer(nlohmann::json::array({Added(261, "cat", false, false, true)})).dump()));
  EXPECT_EQ(tok->Encode("cat"), std::vector<int32_t>{261});
  EXPECT_EQ(tok->Encode("a cat."), (std::vector<int32_t>{tok->Encode("a ")[0], tok->Encode("a ")[1], 261, tok->Encode(".")[0]}));
  const auto inside = tok->Encode("concatenate");
  EXPECT_EQ(std::count(inside.begin(), inside.end(), 261), 0);
}

}  // namespace
}  // namespace dsmesh

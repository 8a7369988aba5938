// Parity with the reference implementation: @lenml/tokenizers (JS port of HF tokenizers) loads the
// same tokenizer.json and encodes a >= 2 MB multilingual corpus; every item's ids must be identical,
// and our decode must reproduce the text and agree with the reference's decode.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "common/tokenizer/testing/reference_runner.h"
#include "common/tokenizer/testing/test_corpus.h"
#include "common/tokenizer/tokenizer.h"

namespace dsmesh {
namespace {

std::string Escape(const std::string& s, size_t max = 160) {
  std::ostringstream o;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = s[i];
    if (c == '\n') o << "\\n";
    else if (c == '\r') o << "\\r";
    else if (c == '\t') o << "\\t";
    else if (c < 0x20 || c == 0x7F) o << "\\x" << std::hex << int(c) << std::dec;
    else o << c;
  }
  if (s.size() > max) o << "...(" << s.size() << " bytes)";
  return o.str();
}

std::string Describe(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t from, size_t count) {
  std::ostringstream o;
  for (size_t i = from; i < ids.size() && i < from + count; ++i) {
    o << ids[i];
    try {
      o << "('" << Escape(tok.IdToToken(ids[i]), 40) << "') ";
    } catch (const std::exception&) {
      o << "(?) ";
    }
  }
  return o.str();
}

void CheckParity(const std::string& dir) {
  const auto tok = Tokenizer::Load(dir);
  const auto corpus = testing::GenerateTokenizerCorpus();
  ASSERT_GE(testing::TotalBytes(corpus), 2000000u);
  std::vector<std::string> texts;
  for (const auto& item : corpus) texts.push_back(item.text);
  const testing::ReferenceEncoding ref = testing::ReferenceEncode(dir, texts);

  std::map<std::string, std::pair<size_t, size_t>> per_category;  // items, mismatches
  size_t mismatches = 0, reported = 0, roundtrip_failures = 0, decode_failures = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto& item = corpus[i];
    const std::vector<int32_t> ids = tok->Encode(item.text);
    auto& stat = per_category[item.category];
    ++stat.first;
    if (ids != ref.ids[i]) {
      ++mismatches;
      ++stat.second;
      if (reported++ < 8) {
        size_t d = 0;
        while (d < ids.size() && d < ref.ids[i].size() && ids[d] == ref.ids[i][d]) ++d;
        const size_t from = d > 3 ? d - 3 : 0;
        ADD_FAILURE() << "item " << i << " (" << item.category << ") differs at token " << d << "\n  text: "
                      << Escape(item.text) << "\n  ours:      " << Describe(*tok, ids, from, 8)
                      << "\n  reference: " << Describe(*tok, ref.ids[i], from, 8);
      }
    }
    const std::string decoded = tok->Decode(ids);
    if (decoded != item.text && roundtrip_failures++ < 5)
      ADD_FAILURE() << "item " << i << " (" << item.category << "): decode(encode(x)) != x for " << Escape(item.text);
    if ((decoded != ref.decoded[i] || tok->Decode(ids, true) != ref.decoded_skip_special[i]) && decode_failures++ < 5)
      ADD_FAILURE() << "item " << i << " (" << item.category << "): decode differs from the reference's decode";
  }
  std::ostringstream summary;
  for (const auto& [cat, stat] : per_category) summary << "  " << cat << ": " << stat.first << " items, " << stat.second << " mismatches\n";
  std::printf("%s: %zu items, %zu bytes, %zu id mismatches\n%s", dir.c_str(), corpus.size(), testing::TotalBytes(corpus),
              mismatches, summary.str().c_str());
  EXPECT_EQ(mismatches, 0u) << summary.str();
  EXPECT_EQ(roundtrip_failures, 0u);
  EXPECT_EQ(decode_failures, 0u);
}

TEST(TokenizerParity, DeepSeekV3MatchesReference) { CheckParity(testing::DeepSeekV3TokenizerDir()); }

TEST(TokenizerParity, DeepSeekV4MatchesReference) { CheckParity(testing::DeepSeekV4TokenizerDir()); }

}  // namespace
}  // namespace dsmesh

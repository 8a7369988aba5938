// Constrained decoding over the real DeepSeek-V4 vocabulary: random walks that pick uniformly among the
// allowed tokens (the worst case a random model can be) always end with EOS in an accepting state within
// the budget, and every output validates against its schema with python3-jsonschema (validate.py).
#include "common/structured/token_grammar.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "common/repo_file.h"
#include "common/structured/schema_compiler.h"

namespace dsmesh::structured {
namespace {

using json = nlohmann::json;

std::shared_ptr<const Tokenizer> Tok() {
  static auto t = [] {
    std::string f = RepoFile("common/tokenizer/data/deepseek_v4/tokenizer.json");
    return Tokenizer::Load(f.substr(0, f.rfind('/')));
  }();
  return t;
}

constexpr int64_t kVocab = 129280;

// Picks uniformly among allowed tokens until EOS or the budget; returns the text.
std::string Walk(CompiledGrammar& g, uint64_t seed, int budget, bool* ended) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> scratch;
  int32_t state = g.start();
  std::string out;
  *ended = false;
  const int32_t eos = *Tok()->eos_id();
  for (int i = 0; i < budget; ++i) {
    const uint64_t* m = g.Mask(state, budget - i, &scratch);
    std::vector<int32_t> allowed;
    for (size_t w = 0; w < g.words(); ++w)
      for (uint64_t b = m[w]; b; b &= b - 1) allowed.push_back(static_cast<int32_t>(w * 64 + __builtin_ctzll(b)));
    EXPECT_FALSE(allowed.empty());
    if (allowed.empty()) break;
    const int32_t tok = allowed[rng() % allowed.size()];
    if (tok == eos) {
      *ended = true;
      break;
    }
    state = g.AdvanceToken(state, tok);
    EXPECT_GE(state, 0);
    out += std::string(Tok()->TokenBytes(tok));  // bytes: a token may end mid-character
  }
  if (!*ended) *ended = g.Accepting(state);
  return out;
}

TEST(TokenGrammar, ThirtyFiveSchemasValidateWithJsonschema) {
  std::ifstream in(RepoFile("common/structured/testdata/schemas.json"));
  json schemas = json::parse(in);
  ASSERT_GE(schemas.size(), 30u);
  GrammarCache cache(Tok(), kVocab);
  json cases = json::array();
  for (const auto& s : schemas) {
    auto g = cache.Get(json{{"type", "json_schema"}, {"schema", s["schema"]}}.dump());
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      bool ended = false;
      std::string out = Walk(*g, seed * 7919, 160, &ended);
      EXPECT_TRUE(ended) << s["name"] << ": " << out;
      cases.push_back({{"name", s["name"]}, {"schema", s["schema"]}, {"output", out}});
    }
  }
  // json_object: any object.
  auto g = cache.Get(R"({"type":"json_object"})");
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    bool ended = false;
    std::string out = Walk(*g, seed, 120, &ended);
    EXPECT_TRUE(ended);
    cases.push_back({{"name", "json_object"}, {"schema", {{"type", "object"}}}, {"output", out}});
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/structured_cases.json";
  std::ofstream(path) << cases.dump(1, ' ', false, json::error_handler_t::replace);
  const std::string py = std::ifstream("/usr/bin/python3").good() ? "/usr/bin/python3" : "python3";
  const std::string cmd = py + " '" + RepoFile("common/structured/testdata/validate.py") + "' '" + path + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string report;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) report.append(buf, n);
  int rc = pclose(p);
  EXPECT_EQ(rc, 0) << report;
  EXPECT_NE(report.find("VALIDATED"), std::string::npos) << report;
  std::printf("%s", report.c_str());
}

TEST(TokenGrammar, RegexChoiceAndToolCalls) {
  GrammarCache cache(Tok(), kVocab);
  bool ended;
  auto re = cache.Get(R"j({"type":"regex","pattern":"[a-c]{2}x(y|zz)"})j");
  std::string out = Walk(*re, 3, 40, &ended);
  EXPECT_TRUE(ended);
  EXPECT_TRUE(std::regex_match(out, std::regex("[a-c]{2}x(y|zz)"))) << out;
  auto ch = cache.Get(R"({"type":"choice","choices":["alpha","beta"]})");
  out = Walk(*ch, 5, 40, &ended);
  EXPECT_TRUE(out == "alpha" || out == "beta") << out;
  json tools = {{"type", "tool_calls"}, {"min_calls", 1}, {"max_calls", 2},
                {"tools", {{{"name", "get_weather"},
                            {"parameters", {{"type", "object"},
                                            {"properties", {{"city", {{"type", "string"}, {"maxLength", 10}}},
                                                            {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 7}}}}},
                                            {"required", {"city", "days"}}}}}}}};
  auto tc = cache.Get(tools.dump());
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    out = Walk(*tc, seed, 200, &ended);
    EXPECT_TRUE(ended) << out;
    EXPECT_NE(out.find("<｜DSML｜invoke name=\"get_weather\">"), std::string::npos) << out;
  }
}

TEST(TokenGrammar, UnsupportedKeywordsAreNamed) {
  auto err = [](const std::string& schema) {
    try {
      CompileSpec(json{{"type", "json_schema"}, {"schema", json::parse(schema)}});
    } catch (const GrammarError& e) {
      return std::string(e.what()) + " @" + e.path;
    }
    return std::string("no error");
  };
  EXPECT_NE(err(R"({"type":"integer","multipleOf":3})").find("multipleOf"), std::string::npos);
  EXPECT_NE(err(R"({"type":"object","properties":{"a":{"not":{}}}})").find("'not'"), std::string::npos);
  EXPECT_NE(err(R"({"type":"object","properties":{"a":{"not":{}}}})").find("/properties/a"), std::string::npos);
  EXPECT_NE(err(R"({"type":"string","format":"ipv6"})").find("ipv6"), std::string::npos);
  EXPECT_NE(err(R"({"type":"array","uniqueItems":true})").find("uniqueItems"), std::string::npos);
  EXPECT_NE(err(R"({"$ref":"#/$defs/a","$defs":{"a":{"type":"object","properties":{"x":{"$ref":"#/$defs/a"}},"required":["x"]}}})")
                .find("admits no value"), std::string::npos);
  EXPECT_NE(err(R"({"type":"string","pattern":"(?=a)b"})").find("lookaround"), std::string::npos);
}

}  // namespace
}  // namespace dsmesh::structured

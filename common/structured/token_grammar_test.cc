// Constrained decoding over the real DeepSeek-V4 vocabulary: random walks that pick uniformly among the
// allowed tokens (the worst case a random model can be) always end with EOS in an accepting state within
// the budget, and every output validates against its schema with python3-jsonschema (validate.py).
#include "common/structured/token_grammar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "common/repo_file.h"
#include "common/structured/schema_compiler.h"
#include "common/structured/state_classes.h"

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

// The tokens the DFA itself accepts from `state` (AdvanceToken on every id): the oracle for Mask().
std::vector<uint64_t> Oracle(CompiledGrammar& g, int32_t state, int64_t limit = -1) {
  std::vector<uint64_t> m(g.words(), 0);
  const int32_t eos = *Tok()->eos_id();
  for (int32_t id = 0; id < kVocab; ++id) {
    const int32_t ns = g.AdvanceToken(state, id);
    if (ns < 0) continue;
    if (limit >= 0 && id != eos && g.Distance(ns) > limit) continue;
    m[id >> 6] |= 1ull << (id & 63);
  }
  return m;
}

size_t Count(const uint64_t* m, size_t words) {
  size_t n = 0;
  for (size_t w = 0; w < words; ++w) n += __builtin_popcountll(m[w]);
  return n;
}

// States of a random walk (distinct, at most `max`).
std::vector<int32_t> WalkStates(CompiledGrammar& g, uint64_t seed, size_t max) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> scratch;
  std::vector<int32_t> states;
  int32_t state = g.start();
  const int32_t eos = *Tok()->eos_id();
  for (int i = 0; i < 200 && states.size() < max; ++i) {
    if (std::find(states.begin(), states.end(), state) == states.end()) states.push_back(state);
    const uint64_t* m = g.Mask(state, 1 << 20, &scratch);
    std::vector<int32_t> allowed;
    for (size_t w = 0; w < g.words(); ++w)
      for (uint64_t b = m[w]; b; b &= b - 1) allowed.push_back(static_cast<int32_t>(w * 64 + __builtin_ctzll(b)));
    if (allowed.empty()) break;
    const int32_t tok = allowed[rng() % allowed.size()];
    if (tok == eos) break;
    const int32_t next = g.AdvanceToken(state, tok);
    EXPECT_GE(next, 0) << "the mask of state " << state << " allows token " << tok << ", which the DFA rejects";
    if (next < 0) break;
    state = next;
  }
  return states;
}

// The specs of the mask tests: every schema, json_object, strings with length bounds (states where text
// characters lead to a chain of states) and a tool-call grammar.
std::vector<std::string> MaskTestSpecs() {
  std::ifstream in(RepoFile("common/structured/testdata/schemas.json"));
  json schemas = json::parse(in);
  std::vector<std::string> specs;
  for (const auto& s : schemas) specs.push_back(json{{"type", "json_schema"}, {"schema", s["schema"]}}.dump());
  specs.push_back(R"({"type":"json_object"})");
  specs.push_back(json{{"type", "json_schema"},
                       {"schema", {{"type", "object"},
                                   {"properties", {{"a", {{"type", "string"}, {"minLength", 3}, {"maxLength", 40}}},
                                                   {"b", {{"type", "string"}, {"pattern", "^[a-z ]{0,20}$"}}}}},
                                   {"required", {"a", "b"}}}}}
                      .dump());
  specs.push_back(json{{"type", "tool_calls"}, {"min_calls", 1}, {"max_calls", 2},
                       {"tools", {{{"name", "f"},
                                   {"parameters", {{"type", "object"},
                                                   {"properties", {{"text", {{"type", "string"}}}}},
                                                   {"required", {"text"}}}}}}}}
                      .dump());
  return specs;
}

// Every mask (the text-token shortcut, the walk of the other tokens, the budget tables) equals the set of
// tokens the DFA accepts token by token, on states of every spec of MaskTestSpecs, with the masks
// precomputed at compile time (the worker's path) or computed lazily on first use.
void CheckMasksAgainstOracle(bool precompute) {
  const std::vector<std::string> specs = MaskTestSpecs();
  GrammarCache cache(Tok(), kVocab, 64, CompiledGrammar::kDefaultCacheBytes,
                     precompute ? GrammarCache::Precompute::kBackground : GrammarCache::Precompute::kNever);
  size_t checked = 0, shortcut = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(specs[i]);
    auto g = cache.Get(specs[i]);
    std::vector<uint64_t> scratch;
    for (int32_t state : WalkStates(*g, 1000 + i, 12)) {
      const uint64_t* m = g->Mask(state, 1 << 20, &scratch);
      std::vector<uint64_t> want = Oracle(*g, state);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), m)) << "state " << state << ": mask has " << Count(m, g->words())
                                                           << " tokens, the DFA accepts " << Count(want.data(), g->words());
      // Near the end of the budget: the tokens whose shortest completion fits (the mask keeps at least the
      // best ones, so compare where some token fits).
      for (int64_t remaining : {1, 3, 10, 40}) {
        const uint64_t* tail = g->Mask(state, remaining, &scratch);
        std::vector<uint64_t> fits = Oracle(*g, state, remaining - 1);
        if (Count(fits.data(), g->words()) == (g->Accepting(state) ? 1u : 0u)) continue;  // only EOS fits
        ASSERT_TRUE(std::equal(fits.begin(), fits.end(), tail)) << "state " << state << " remaining " << remaining;
      }
      ++checked;
    }
    shortcut += g->cache_stats().text_shortcut;
  }
  EXPECT_GE(checked, 200u);
  if (!precompute) {
    EXPECT_GT(shortcut, 20u);  // the shortcut is exercised, not only the walk
  }
}

TEST(TokenGrammar, MasksEqualTokenByTokenAcceptance) { CheckMasksAgainstOracle(false); }
TEST(TokenGrammar, PrecomputedMasksEqualTokenByTokenAcceptance) { CheckMasksAgainstOracle(true); }

// The precomputed table (one mask per class of equivalent states, identical masks shared) gives every
// state of every test grammar the mask the lazy path (text table + trie walk) computes for that state,
// and the budget masks built from the budget profiles equal those built by the walk.
TEST(TokenGrammar, PrecomputedMasksEqualWalkedMasksForAllStates) {
  GrammarCache cache(Tok(), kVocab, 64, CompiledGrammar::kDefaultCacheBytes, GrammarCache::Precompute::kAtCompile);
  size_t states = 0, shared = 0, profiles = 0;
  for (const std::string& spec : MaskTestSpecs()) {
    SCOPED_TRACE(spec);
    auto g = cache.Get(spec);
    const auto& p = g->precompute_stats();
    ASSERT_TRUE(p.done);
    EXPECT_EQ(p.states, g->num_states());  // every reachable state was built: none appears later
    EXPECT_LE(p.distinct_masks, static_cast<size_t>(p.classes));
    shared += g->num_states() - p.distinct_masks;
    std::vector<uint64_t> scratch;
    for (int32_t s = 0; s < static_cast<int32_t>(g->num_states()); ++s) {
      const std::vector<uint64_t> want = g->ComputeMaskForTest(s);
      const uint64_t* m = g->Mask(s, 1 << 20, &scratch);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), m)) << "state " << s;
      // Budget masks from the budget profiles == budget masks by the walk.
      for (int64_t remaining : {1, 3, 8}) {
        const std::vector<uint64_t> tail = g->ComputeMaskForTest(s, remaining);
        const uint64_t* t = g->Mask(s, remaining, &scratch);
        ASSERT_TRUE(std::equal(tail.begin(), tail.end(), t)) << "state " << s << " remaining " << remaining;
      }
      ++states;
    }
    EXPECT_EQ(g->cache_stats().full_masks, 0u);  // no mask was computed outside the table
    profiles += p.profiles;
  }
  EXPECT_GT(states, 10000u);
  EXPECT_GT(shared, 5000u);  // equivalent states and identical masks are shared
  EXPECT_GT(profiles, 100u);
}

// Background precomputation: a grammar dropped while its thread runs stops it (no use after free), and one
// used at once serves its first step without waiting for the thread (the step computes the mask itself),
// with the mask the table holds once the thread is done.
TEST(TokenGrammar, BackgroundPrecomputeRunsBesideTheSteps) {
  GrammarCache cache(Tok(), kVocab, 1);  // capacity 1: each Get drops the previous grammar
  cache.Get(R"({"type":"json_object"})");
  cache.Get(json{{"type", "json_schema"}, {"schema", {{"type", "string"}, {"format", "email"}}}}.dump());
  auto g = cache.Get(R"({"type":"json_object"})");
  std::vector<uint64_t> scratch;
  const uint64_t* m = g->Mask(g->start(), 1 << 20, &scratch);
  const std::vector<uint64_t> first(m, m + g->words());
  EXPECT_EQ(first, g->ComputeMaskForTest(g->start()));
  EXPECT_TRUE(g->precompute_stats().done);  // waits for the thread
  m = g->Mask(g->start(), 1 << 20, &scratch);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), m));
}

// The masks a request gets while its grammar's precomputation runs beside its steps (computed by the step
// itself until the thread's table is adopted, from the table after that; budget masks near the end) equal
// the reference path's (the walk and the text table for that state alone, no table, no profile), on
// every state reached over the test specs. Once the thread is done, the adopted table gives the same
// masks, and every state of the grammar (built after the adoption, matched to the table's states by
// their NFA sets) gets its mask from the table, equal to the reference path's.
TEST(TokenGrammar, MasksServedWhilePrecomputingEqualReference) {
  GrammarCache cache(Tok(), kVocab);  // background precomputation, the worker's mode
  struct Served {
    int32_t state;
    int64_t remaining;
    std::vector<uint64_t> mask;
  };
  size_t checked = 0, all_states = 0;
  uint64_t by_step = 0;  // masks the steps computed because the table did not hold them yet
  const int32_t eos = *Tok()->eos_id();
  for (const std::string& spec : MaskTestSpecs()) {
    SCOPED_TRACE(spec);
    auto g = cache.Get(spec);
    std::vector<Served> served;
    std::vector<uint64_t> scratch;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      std::mt19937_64 rng(seed);
      const int budget = 90;
      int32_t state = g->start();
      for (int i = 0; i < budget && state >= 0; ++i) {
        const uint64_t* m = g->Mask(state, budget - i, &scratch);
        served.push_back({state, budget - i, std::vector<uint64_t>(m, m + g->words())});
        std::vector<int32_t> allowed;
        for (size_t w = 0; w < g->words(); ++w)
          for (uint64_t b = m[w]; b; b &= b - 1) allowed.push_back(static_cast<int32_t>(w * 64 + __builtin_ctzll(b)));
        ASSERT_FALSE(allowed.empty());
        const int32_t tok = allowed[rng() % allowed.size()];
        if (tok == eos) break;
        state = g->AdvanceToken(state, tok);
        ASSERT_GE(state, 0);
      }
    }
    by_step += g->cache_stats().full_masks;
    ASSERT_TRUE(g->precompute_stats().done);
    for (const Served& s : served) {
      ASSERT_EQ(s.mask, g->ComputeMaskForTest(s.state, s.remaining)) << "state " << s.state << " remaining " << s.remaining;
      const uint64_t* m = g->Mask(s.state, s.remaining, &scratch);
      ASSERT_TRUE(std::equal(s.mask.begin(), s.mask.end(), m)) << "state " << s.state << " remaining " << s.remaining;
      ++checked;
    }
    // Every state reachable from the start (built now, by bytes), each with the table's mask.
    const uint64_t computed = g->cache_stats().full_masks;
    for (int32_t s = 0; s < static_cast<int32_t>(g->num_states()); ++s)
      for (int b = 0; b < 256; ++b) g->Next(s, static_cast<uint8_t>(b));
    EXPECT_EQ(g->num_states(), g->precompute_stats().states);
    for (int32_t s = 0; s < static_cast<int32_t>(g->num_states()); ++s) {
      const uint64_t* m = g->Mask(s, 1 << 20, &scratch);
      const std::vector<uint64_t> want = g->ComputeMaskForTest(s);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), m)) << "state " << s;
      ++all_states;
    }
    EXPECT_EQ(g->cache_stats().full_masks, computed);  // no state missed the table
  }
  EXPECT_GT(all_states, 10000u);
  EXPECT_GT(checked, 2000u);
  EXPECT_GT(by_step, 0u);  // the largest grammars' first steps ran before their table was complete
}

// Equivalent states of a small DFA: states 1 and 2 accept the same language, 0 and 3 do not.
TEST(StateClasses, MooreRefinement) {
  // 0 -a-> 1, 0 -b-> 2, 1 -a-> 3, 2 -a-> 3, 3 accepting, 3 -a-> 3.
  std::vector<int32_t> trans(4 * 256, -1);
  trans[0 * 256 + 'a'] = 1;
  trans[0 * 256 + 'b'] = 2;
  trans[1 * 256 + 'a'] = 3;
  trans[2 * 256 + 'a'] = 3;
  trans[3 * 256 + 'a'] = 3;
  std::vector<char> accepting = {0, 0, 0, 1};
  std::vector<uint8_t> reps = {0, 'a', 'b', 'c'};
  int32_t classes = 0;
  std::vector<int32_t> cls = EquivalentStates(4, accepting, trans.data(), reps, &classes);
  EXPECT_EQ(classes, 3);
  EXPECT_EQ(cls[1], cls[2]);
  EXPECT_NE(cls[0], cls[1]);
  EXPECT_NE(cls[0], cls[3]);
  EXPECT_NE(cls[1], cls[3]);
  // One more byte tells 1 and 2 apart.
  trans[2 * 256 + 'c'] = 3;
  cls = EquivalentStates(4, accepting, trans.data(), reps, &classes);
  EXPECT_EQ(classes, 4);
  EXPECT_NE(cls[1], cls[2]);
}

// The mask cache stays within its byte bound (evicting the least recently used masks), and
// masks recomputed after eviction are the same.
TEST(TokenGrammar, MaskCacheIsBoundedInBytes) {
  const size_t limit = 256 << 10;  // room for ~15 masks of 129,280 bits
  GrammarCache cache(Tok(), kVocab, 4, limit);
  json props = json::object(), required = json::array();
  for (int i = 0; i < 12; ++i) {
    props["p" + std::to_string(i)] = i % 2 ? json{{"type", "string"}, {"maxLength", 6}} : json{{"type", "integer"}};
    required.push_back("p" + std::to_string(i));
  }
  auto g = cache.Get(
      json{{"type", "json_schema"}, {"schema", {{"type", "object"}, {"properties", props}, {"required", required}}}}.dump());
  std::vector<uint64_t> scratch;
  std::vector<int32_t> states;
  for (uint64_t seed = 1; seed <= 6; ++seed)
    for (int32_t s : WalkStates(*g, seed, 40))
      if (std::find(states.begin(), states.end(), s) == states.end()) states.push_back(s);
  ASSERT_GT(states.size(), 30u);
  for (int32_t s : states) {
    g->Mask(s, 1 << 20, &scratch);
    g->Mask(s, 5, &scratch);  // a budget mask too
    auto st = g->cache_stats();
    EXPECT_TRUE(st.bytes <= limit || st.entries <= 3) << st.bytes << " bytes in " << st.entries << " entries";
  }
  auto st = g->cache_stats();
  EXPECT_GT(st.evictions, 0u);
  EXPECT_EQ(st.limit_bytes, limit);
  const uint64_t computed = st.full_masks;
  for (int32_t s : states) {
    std::vector<uint64_t> want = Oracle(*g, s);
    const uint64_t* m = g->Mask(s, 1 << 20, &scratch);
    ASSERT_TRUE(std::equal(want.begin(), want.end(), m)) << "state " << s;
  }
  EXPECT_GT(g->cache_stats().full_masks, computed);  // evicted masks were recomputed
}

// Text tokens: whole UTF-8 characters a JSON string holds unescaped.
TEST(TokenGrammar, TextTokens) {
  EXPECT_EQ(TextTokenChars("abc"), 3);
  EXPECT_EQ(TextTokenChars(" 日本"), 3);
  EXPECT_EQ(TextTokenChars("🧠x"), 2);
  EXPECT_EQ(TextTokenChars("\x7F"), 1);
  EXPECT_EQ(TextTokenChars("a\"b"), -1);
  EXPECT_EQ(TextTokenChars("a\\"), -1);
  EXPECT_EQ(TextTokenChars("\n"), -1);
  EXPECT_EQ(TextTokenChars("\xE6\x97"), -1);          // a piece of a character
  EXPECT_EQ(TextTokenChars("\xED\xA0\x80"), -1);      // a surrogate
  EXPECT_EQ(TextTokenChars("\xC0\xAF"), -1);          // overlong
  EXPECT_EQ(TextTokenChars("\xF4\x90\x80\x80"), -1);  // beyond U+10FFFF
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

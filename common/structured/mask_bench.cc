// Cost of one constrained step of one sequence on one core: Mask() (the allowed-token bitset for the
// sequence's state, budget-aware) + AdvanceToken(), over random walks on every schema of
// testdata/schemas.json and json_object, on the real 129,280-token vocabulary. Prints p50/p99/max for the
// first request with a schema (cold: states and masks are computed as they are reached) and for a repeat
// request (warm: the compiled grammar is cached by spec text, as in the worker).
//   bazel run -c opt //common/structured:mask_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/repo_file.h"
#include "common/structured/token_grammar.h"

using namespace dsmesh;
using namespace dsmesh::structured;
using json = nlohmann::json;

namespace {
double Us(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
}
void Report(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto q = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))]; };
  std::printf("%-34s steps %6zu  p50 %8.2f us  p90 %8.2f us  p99 %8.2f us  max %9.1f us\n", what, v.size(), q(0.5),
              q(0.9), q(0.99), v.back());
}
}  // namespace

int main() {
  std::string f = RepoFile("common/tokenizer/data/deepseek_v4/tokenizer.json");
  auto tok = Tokenizer::Load(f.substr(0, f.rfind('/')));
  std::ifstream in(RepoFile("common/structured/testdata/schemas.json"));
  json schemas = json::parse(in);
  std::vector<std::string> specs;
  for (const auto& s : schemas) specs.push_back(json{{"type", "json_schema"}, {"schema", s["schema"]}}.dump());
  specs.push_back(R"({"type":"json_object"})");
  GrammarCache cache(tok, 129280);
  auto t0 = std::chrono::steady_clock::now();
  cache.Get(specs[0]);  // builds the vocabulary trie once
  std::printf("vocabulary trie: %.1f ms (once per worker)\n", Us(t0) / 1000);
  std::vector<double> compile, cold, warm, warm_far;
  struct Slow {
    double us;
    size_t spec, allowed;
    int step;
    bool tail, walked;  // walked: a mask computed by walking the whole vocabulary
  };
  std::vector<Slow> slow;  // the slowest cold steps, to say where the cost is
  const int budget = 256;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < specs.size(); ++i) {
      auto c0 = std::chrono::steady_clock::now();
      auto g = cache.Get(specs[i]);
      if (pass == 0) compile.push_back(Us(c0));
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        std::mt19937_64 rng(seed * 1000 + i);
        std::vector<uint64_t> scratch;
        int32_t state = g->start();
        for (int step = 0; step < budget; ++step) {
          const auto before = g->cache_stats();
          auto s0 = std::chrono::steady_clock::now();
          const uint64_t* m = g->Mask(state, budget - step, &scratch);
          double us = Us(s0);
          const auto after = g->cache_stats();
          const bool walked = after.full_masks > before.full_masks && after.text_shortcut == before.text_shortcut;
          // Pick the k-th allowed token (uniform), outside the timing: that is the sampler's job.
          size_t count = 0;
          for (size_t w = 0; w < g->words(); ++w) count += __builtin_popcountll(m[w]);
          size_t k = rng() % count;
          int32_t tok_id = -1;
          for (size_t w = 0; w < g->words() && tok_id < 0; ++w) {
            size_t c = __builtin_popcountll(m[w]);
            if (k >= c) { k -= c; continue; }
            uint64_t b = m[w];
            while (k--) b &= b - 1;
            tok_id = static_cast<int32_t>(w * 64 + __builtin_ctzll(b));
          }
          const bool tail = budget - step <= g->Distance(state) + 64;
          if (tok_id == *tok->eos_id()) { (pass ? warm : cold).push_back(us); break; }
          auto a0 = std::chrono::steady_clock::now();
          state = g->AdvanceToken(state, tok_id);
          us += Us(a0);
          (pass ? warm : cold).push_back(us);
          if (!pass) slow.push_back({us, i, count, step, tail, walked});
          if (pass && budget - step > g->Distance(state) + 64) warm_far.push_back(us);
        }
      }
    }
  }
  // What the mask caches hold after both passes (bounded per grammar), and how many masks used the
  // text-token table instead of walking the whole vocabulary.
  size_t bytes = 0, entries = 0, states = 0;
  uint64_t evictions = 0, masks = 0, shortcut = 0;
  for (const auto& spec : specs) {
    auto g = cache.Get(spec);
    auto s = g->cache_stats();
    bytes += s.bytes;
    entries += s.entries;
    evictions += s.evictions;
    masks += s.full_masks;
    shortcut += s.text_shortcut;
    states += g->num_states();
  }
  std::printf("DFA states %zu; masks computed %llu (%llu with the text-token table); cache %zu entries, %.1f MiB "
              "(bound %.0f MiB per grammar), %llu evictions\n",
              states, static_cast<unsigned long long>(masks), static_cast<unsigned long long>(shortcut), entries,
              bytes / 1048576.0, CompiledGrammar::kDefaultCacheBytes / 1048576.0,
              static_cast<unsigned long long>(evictions));
  std::sort(slow.begin(), slow.end(), [](const Slow& a, const Slow& b) { return a.us > b.us; });
  for (size_t k = 0; k < std::min<size_t>(5, slow.size()); ++k)
    std::printf("slow cold step: %8.1f us  %s (spec %zu), step %d, %zu tokens allowed%s%s\n", slow[k].us,
                slow[k].spec < schemas.size() ? schemas[slow[k].spec]["name"].get<std::string>().c_str() : "json_object",
                slow[k].spec, slow[k].step, slow[k].allowed, slow[k].tail ? ", budget tail" : "",
                slow[k].walked ? ", whole vocabulary walked" : "");
  Report("compile spec -> NFA (per schema)", compile);
  Report("step, first request (cold)", cold);
  Report("step, repeat request (warm)", warm);
  Report("step, warm, outside budget tail", warm_far);
  return 0;
}

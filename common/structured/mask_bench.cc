// Cost of one constrained step of one sequence on one core: Mask() (the allowed-token bitset for the
// sequence's state, budget-aware) + AdvanceToken(), over random walks on every schema of
// testdata/schemas.json and json_object, on the real 129,280-token vocabulary. Prints p50/p99/max for the
// first request with a schema (cold: the grammar was just compiled) and for a repeat request (warm), next
// to the 50 us target, and the compile time per schema (spec -> NFA, and the mask precomputation).
// Runs with the precomputed mask table (what the worker does) and with lazy masks (each state's mask
// computed on its first visit, the earlier design), for comparison; each kReps times from a fresh cache.
//   bazel build -c opt //common/structured:mask_bench && bazel-bin/common/structured/mask_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <time.h>

#include "common/repo_file.h"
#include "common/structured/token_grammar.h"

using namespace dsmesh;
using namespace dsmesh::structured;
using json = nlohmann::json;

namespace {

constexpr double kTargetUs = 50;

double Us(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
}

// This thread's CPU time: a step that the OS preempted (other builds share the cores) shows a wall time
// far above its CPU time, so the target is judged on CPU time, the cost on one core.
double CpuUs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

double Quantile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

void Report(const char* what, const std::vector<double>& v, const char* unit = "us", double scale = 1) {
  const double max = *std::max_element(v.begin(), v.end()) / scale;
  std::printf("%-40s n %5zu  p50 %9.2f %s  p90 %9.2f %s  p99 %9.2f %s  max %9.2f %s\n", what, v.size(),
              Quantile(v, 0.5) / scale, unit, Quantile(v, 0.9) / scale, unit, Quantile(v, 0.99) / scale, unit,
              max, unit);
}

// The per-step figures judged against the target: for each step, the least over kReps independent runs
// (each from a fresh cache, so each is a first request) of the lesser of its wall and CPU time. A single
// run's maximum is set by interrupts and preemption on a shared machine (warm steps that are one table
// lookup read 40-80 us there); the same step of another run does the same work.
void Verdict(const char* what, const std::vector<double>& cost) {
  const double max = *std::max_element(cost.begin(), cost.end());
  const size_t over = std::count_if(cost.begin(), cost.end(), [](double c) { return c > kTargetUs; });
  std::printf("%-40s n %5zu  p50 %9.2f us  p90 %9.2f us  p99 %9.2f us  max %9.2f us  [target %.0f us: %s, %zu "
              "steps over]\n",
              what, cost.size(), Quantile(cost, 0.5), Quantile(cost, 0.9), Quantile(cost, 0.99), max, kTargetUs,
              max <= kTargetUs ? "every step meets it" : "NOT met", over);
}

constexpr int kReps = 3;

struct Slow {
  size_t index;  // into the cold steps
  size_t spec, allowed;
  int step;
  bool tail;
  uint64_t masks;  // budget masks built in the step
};

void Run(const std::shared_ptr<const Tokenizer>& tok, const json& schemas, const std::vector<std::string>& specs,
         bool precompute) {
  std::printf("\n== %s ==\n", precompute ? "precomputed mask table (the worker's path)" : "lazy masks (no precomputation)");
  const auto mode = precompute ? GrammarCache::Precompute::kAtCompile : GrammarCache::Precompute::kNever;
  std::unique_ptr<GrammarCache> cache;
  std::vector<double> nfa, compile, pre;
  std::vector<double> cold, warm, warm_far;                 // run 0, wall
  std::vector<double> cold_best, warm_best, warm_far_best;  // least over the runs of min(wall, CPU)
  std::vector<Slow> slow;
  const int budget = 256;
  for (int rep = 0; rep < kReps; ++rep) {
    cache = std::make_unique<GrammarCache>(tok, 129280, 64, CompiledGrammar::kDefaultCacheBytes, mode);
    auto t0 = std::chrono::steady_clock::now();
    cache->Get(R"({"type":"json_schema","schema":{"type":"boolean"}})");  // builds the vocabulary trie once
    if (rep == 0) std::printf("vocabulary trie: %.1f ms (once per worker)\n", Us(t0) / 1000);
    std::vector<double> c_wall, c_cost, w_wall, w_cost, f_wall, f_cost;
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < specs.size(); ++i) {
        if (pass == 0 && rep == 0) {
          auto n0 = std::chrono::steady_clock::now();
          CheckSpec(specs[i]);  // spec -> NFA alone
          nfa.push_back(Us(n0));
        }
        auto c0 = std::chrono::steady_clock::now();
        auto g = cache->Get(specs[i]);
        if (pass == 0 && rep == 0) {
          compile.push_back(Us(c0));
          const auto& p = g->precompute_stats();
          pre.push_back((p.expand_ms + p.classes_ms + p.masks_ms) * 1000);
        }
        for (uint64_t seed = 1; seed <= 3; ++seed) {
          std::mt19937_64 rng(seed * 1000 + i);
          std::vector<uint64_t> scratch;
          int32_t state = g->start();
          for (int step = 0; step < budget; ++step) {
            const auto before = g->cache_stats();
            const double cpu0 = CpuUs();
            auto s0 = std::chrono::steady_clock::now();
            const uint64_t* m = g->Mask(state, budget - step, &scratch);
            double us = Us(s0);
            double cpu = CpuUs() - cpu0;
            // Pick the k-th allowed token (uniform), outside the timing: that is the sampler's job.
            size_t count = 0;
            for (size_t w = 0; w < g->words(); ++w) count += __builtin_popcountll(m[w]);
            size_t k = rng() % count;
            int32_t tok_id = -1;
            for (size_t w = 0; w < g->words() && tok_id < 0; ++w) {
              size_t c = __builtin_popcountll(m[w]);
              if (k >= c) {
                k -= c;
                continue;
              }
              uint64_t b = m[w];
              while (k--) b &= b - 1;
              tok_id = static_cast<int32_t>(w * 64 + __builtin_ctzll(b));
            }
            const bool tail = budget - step <= g->Distance(state) + 64;
            const bool eos = tok_id == *tok->eos_id();
            if (!eos) {
              const double cpu1 = CpuUs();
              auto a0 = std::chrono::steady_clock::now();
              state = g->AdvanceToken(state, tok_id);
              us += Us(a0);
              cpu += CpuUs() - cpu1;
            }
            (pass ? w_wall : c_wall).push_back(us);
            (pass ? w_cost : c_cost).push_back(std::min(us, cpu));
            const auto after = g->cache_stats();
            if (!pass && rep == 0)
              slow.push_back({c_wall.size() - 1, i, count, step, tail, after.tail_masks - before.tail_masks});
            if (pass && !eos && budget - step > g->Distance(state) + 64) {
              f_wall.push_back(us);
              f_cost.push_back(std::min(us, cpu));
            }
            if (eos) break;
          }
        }
      }
    }
    if (rep == 0) {
      cold = c_wall, warm = w_wall, warm_far = f_wall;
      cold_best = c_cost, warm_best = w_cost, warm_far_best = f_cost;
    } else if (c_cost.size() == cold_best.size() && w_cost.size() == warm_best.size() &&
               f_cost.size() == warm_far_best.size()) {
      for (size_t k = 0; k < c_cost.size(); ++k) cold_best[k] = std::min(cold_best[k], c_cost[k]);
      for (size_t k = 0; k < w_cost.size(); ++k) warm_best[k] = std::min(warm_best[k], w_cost[k]);
      for (size_t k = 0; k < f_cost.size(); ++k) warm_far_best[k] = std::min(warm_far_best[k], f_cost[k]);
    } else {
      std::printf("run %d took other steps than run 0: not combined\n", rep);
    }
  }
  GrammarCache& last = *cache;
  size_t bytes = 0, entries = 0, states = 0, classes = 0, distinct = 0, full = 0, profiles = 0;
  uint64_t evictions = 0, masks = 0, tail_masks = 0;
  for (const auto& spec : specs) {
    auto g = last.Get(spec);
    auto s = g->cache_stats();
    const auto& p = g->precompute_stats();
    bytes += s.bytes;
    entries += s.entries;
    evictions += s.evictions;
    masks += s.full_masks;
    tail_masks += s.tail_masks;
    states += g->num_states();
    classes += p.classes;
    distinct += p.distinct_masks;
    profiles += p.profiles;
    full += p.done;
  }
  std::printf("DFA states %zu; %zu of %zu grammars fully precomputed (%zu classes of equivalent states, %zu distinct "
              "masks, %zu budget profiles); masks computed lazily %llu; cache %zu entries, %.1f MiB in all (bound %.0f "
              "MiB per grammar), %llu evictions\n",
              states, full, specs.size(), classes, distinct, profiles, static_cast<unsigned long long>(masks), entries,
              bytes / 1048576.0, CompiledGrammar::kDefaultCacheBytes / 1048576.0,
              static_cast<unsigned long long>(evictions));
  std::printf("budget masks built %llu\n", static_cast<unsigned long long>(tail_masks));
  std::sort(slow.begin(), slow.end(),
            [&](const Slow& a, const Slow& b) { return cold_best[a.index] > cold_best[b.index]; });
  for (size_t k = 0; k < std::min<size_t>(8, slow.size()); ++k)
    std::printf("slow cold step: %8.1f us (run 0: %8.1f us)  %s (spec %zu), step %d, %zu tokens allowed%s%s\n", cold_best[slow[k].index], cold[slow[k].index],
                slow[k].spec < schemas.size() ? schemas[slow[k].spec]["name"].get<std::string>().c_str() : "json_object",
                slow[k].spec, slow[k].step, slow[k].allowed, slow[k].tail ? ", budget tail" : "",
                slow[k].masks ? ", built a budget mask" : "");
  size_t worst = std::max_element(compile.begin(), compile.end()) - compile.begin();
  Report("compile: spec -> NFA (per schema)", nfa, "ms", 1000);
  if (precompute) Report("compile: mask precomputation", pre, "ms", 1000);
  Report("compile: total (GrammarCache::Get)", compile, "ms", 1000);
  if (precompute) {
    std::vector<size_t> order(compile.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return compile[a] > compile[b]; });
    std::printf("next slowest compiles:");
    for (size_t k = 1; k < std::min<size_t>(6, order.size()); ++k)
      std::printf(" %s %.1f ms%s", order[k] < schemas.size() ? schemas[order[k]]["name"].get<std::string>().c_str() : "json_object",
                  compile[order[k]] / 1000, k + 1 < std::min<size_t>(6, order.size()) ? "," : "\n");
    auto g = last.Get(specs[worst]);
    const auto& p = g->precompute_stats();
    std::printf("slowest compile: %s, %.2f ms (%zu byte classes; DFA states %zu built in %.2f ms, %d classes in %.2f "
                "ms, masks in %.2f ms: %zu distinct, %.1f MiB)\n",
                worst < schemas.size() ? schemas[worst]["name"].get<std::string>().c_str() : "json_object",
                compile[worst] / 1000, p.byte_classes, p.states, p.expand_ms, p.classes, p.classes_ms, p.masks_ms, p.distinct_masks,
                p.bytes / 1048576.0);
  }
  Report("step, cold (first request), run 0 wall", cold);
  Report("step, warm (repeat request), run 0 wall", warm);
  Report("step, warm outside budget tail, run 0", warm_far);
  std::printf("per step, least of %d runs of min(wall, CPU):\n", kReps);
  Verdict("step, cold (first request)", cold_best);
  Verdict("step, warm (repeat request)", warm_best);
  Verdict("step, warm, outside budget tail", warm_far_best);
}

}  // namespace

int main(int argc, char** argv) {
  std::string f = RepoFile("common/tokenizer/data/deepseek_v4/tokenizer.json");
  auto tok = Tokenizer::Load(f.substr(0, f.rfind('/')));
  std::ifstream in(RepoFile("common/structured/testdata/schemas.json"));
  json schemas = json::parse(in);
  std::vector<std::string> specs;
  for (const auto& s : schemas) specs.push_back(json{{"type", "json_schema"}, {"schema", s["schema"]}}.dump());
  specs.push_back(R"({"type":"json_object"})");
  const bool lazy_too = !(argc > 1 && std::string(argv[1]) == "--precomputed-only");
  Run(tok, schemas, specs, true);
  // The worker's mode: Get() starts the precomputation on a thread and returns; the first Mask() waits
  // for it. With no prefill to overlap, the first step waits for the whole precomputation.
  {
    GrammarCache cache(tok, 129280);
    cache.Get(R"({"type":"json_schema","schema":{"type":"boolean"}})");
    std::vector<double> get, first;
    std::vector<uint64_t> scratch;
    for (const auto& spec : specs) {
      auto t0 = std::chrono::steady_clock::now();
      auto g = cache.Get(spec);
      get.push_back(Us(t0));
      t0 = std::chrono::steady_clock::now();
      g->Mask(g->start(), 256, &scratch);
      first.push_back(Us(t0));
    }
    std::printf("\n== background precomputation (the worker's mode) ==\n");
    Report("Get() returns (spec -> NFA, thread)", get, "ms", 1000);
    Report("first Mask() waits, no prefill", first, "ms", 1000);
  }
  if (lazy_too) Run(tok, schemas, specs, false);
  return 0;
}

// `dsmesh ppl --model DIR --file F [--ctx N] [--chunks N] [--threads N] [--device cpu|cuda]`: perplexity of a
// text file under the model, with the semantics of the seat's ppl-vllm.py: the file is tokenized without
// special tokens, cut into disjoint windows of --ctx tokens, and each window is scored from its second
// token on (the first has no context). Prints progress to stderr and one JSON line to stdout.
// (The --url variant through the gateway's prompt_logprobs is not written yet: docs/trained-model.md.)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/cli_registry.h"
#include "common/flags.h"
#include "common/tokenizer/tokenizer.h"
#include "model/cli_model.h"
#include "model/model.h"

namespace dsmesh {
namespace {

int RunPpl(const std::vector<std::string>& args) {
  Flags f(args, {"model", "file", "ctx", "chunks", "threads", "device", "tokenizer", "enforce-eager"}, {"enforce-eager"});
  const std::string dir = f.Require("model");
  const std::string path = f.Require("file");
  const long long ctx = f.GetInt("ctx", 512), max_chunks = f.GetInt("chunks", 0);
  if (ctx < 2) throw UsageError("--ctx must be >= 2");
  if (max_chunks < 0) throw UsageError("--chunks must be >= 0");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  const auto tokenizer = Tokenizer::Load(f.Get("tokenizer", dir));
  const std::vector<int32_t> ids = tokenizer->Encode(text.str(), false);
  long long chunks = static_cast<long long>(ids.size()) / ctx;
  if (max_chunks > 0 && max_chunks < chunks) chunks = max_chunks;
  if (chunks == 0)
    throw std::runtime_error(path + ": " + std::to_string(ids.size()) + " tokens, fewer than one window of --ctx " +
                             std::to_string(ctx));
  auto model = LoadForCli(f);
  const int64_t V = model->config().vocab_size;
  double nll = 0;
  long long scored = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (long long c = 0; c < chunks; ++c) {
    std::vector<int32_t> window(ids.begin() + c * ctx, ids.begin() + (c + 1) * ctx);
    auto state = model->NewState();
    auto out = model->Forward({{state.get(), window, /*all_logits=*/true}});
    const float* l = out[0].logits.as<float>();
    for (long long t = 0; t + 1 < ctx; ++t) {
      const float* row = l + t * V;
      double mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(row[v] - mx);
      nll += mx + std::log(s) - row[window[t + 1]];
      ++scored;
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[ppl] window %lld/%lld: running ppl %.3f (%.1f s)\n", c + 1, chunks, std::exp(nll / scored), el);
  }
  nlohmann::json j = {{"ppl", std::exp(nll / scored)}, {"nll_per_token", nll / scored}, {"windows", chunks},
                      {"ctx", ctx}, {"scored_tokens", scored}, {"file_tokens", ids.size()}};
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

DSMESH_REGISTER_COMMAND(ppl, "ppl --model DIR --file F [--ctx 512] [--chunks N] [--threads N] [--device cpu|cuda]", RunPpl);

}  // namespace dsmesh

// `dsmesh ppl --model DIR|--url http://H:P --file F [--ctx N] [--chunks N]`: perplexity of a text file
// with the semantics of the reference deployment's ppl-vllm.py: the file is tokenized without special tokens, cut into
// disjoint windows of --ctx tokens, and each window is scored from its second token on (the first has no
// context). --model runs the model in process ([--threads N] [--device cpu|cuda] [--enforce-eager]
// [--tokenizer DIR]); --url asks a running gateway (ours or vLLM) through /tokenize and /v1/completions
// with prompt_logprobs (cli/model_commands/ppl_gateway.h; [--api-key K] [--timeout-s S], --tokenizer DIR tokenizes
// locally instead). Prints a progress line per window on stderr and one JSON line on stdout.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/model_commands/load_model.h"
#include "cli/model_commands/model_commands.h"
#include "cli/model_commands/ppl_gateway.h"
#include "common/flags.h"
#include "common/tokenizer/tokenizer.h"
#include "model/model.h"

namespace dsmesh {
namespace {

// -sum log p(window[t+1] | window[..t]) for t = 0 .. ctx-2, from the in-process model's logits.
double ModelWindowNll(Model& model, const std::vector<int32_t>& window) {
  const int64_t V = model.config().vocab_size;
  auto state = model.NewState();
  auto out = model.Forward({{state.get(), window, /*all_logits=*/true}});
  const float* l = out[0].logits.as<float>();
  double nll = 0;
  for (size_t t = 0; t + 1 < window.size(); ++t) {
    const float* row = l + t * V;
    double mx = row[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(row[v] - mx);
    nll += mx + std::log(s) - row[window[t + 1]];
  }
  return nll;
}

}  // namespace

int RunPpl(const std::vector<std::string>& args) {
  Flags f(args, {"model", "url", "file", "ctx", "chunks", "threads", "device", "tokenizer", "enforce-eager", "kv-cache-dtype", "api-key",
                 "timeout-s"},
          {"enforce-eager"});
  if (f.Has("model") == f.Has("url")) throw UsageError("ppl needs exactly one of --model DIR and --url http://HOST:PORT");
  const std::string path = f.Require("file");
  const long long ctx = f.GetInt("ctx", 512), max_chunks = f.GetInt("chunks", 0);
  if (ctx < 2) throw UsageError("--ctx must be >= 2");
  if (max_chunks < 0) throw UsageError("--chunks must be >= 0");
  const long long timeout_s = f.GetInt("timeout-s", 600);
  if (timeout_s <= 0) throw UsageError("--timeout-s must be positive");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();

  std::unique_ptr<PplGateway> gateway;
  if (f.Has("url")) gateway = std::make_unique<PplGateway>(f.Get("url"), f.Get("api-key", ""), static_cast<int>(timeout_s));
  const std::string source = gateway ? f.Get("url") : f.Get("model");
  std::vector<int32_t> ids;
  if (gateway && !f.Has("tokenizer")) ids = gateway->Tokenize(text.str());
  else ids = Tokenizer::Load(f.Get("tokenizer", source))->Encode(text.str(), false);
  long long chunks = static_cast<long long>(ids.size()) / ctx;
  if (max_chunks > 0 && max_chunks < chunks) chunks = max_chunks;
  if (chunks == 0)
    throw std::runtime_error(path + ": " + std::to_string(ids.size()) + " tokens, fewer than one window of --ctx " +
                             std::to_string(ctx));
  std::unique_ptr<Model> model;
  std::function<double(const std::vector<int32_t>&)> window_nll;
  if (gateway) {
    std::fprintf(stderr, "[ppl] %s (model %s): %lld windows of %lld tokens\n", source.c_str(),
                 gateway->model_name().c_str(), chunks, ctx);
    window_nll = [&](const std::vector<int32_t>& w) { return gateway->WindowNll(w); };
  } else {
    model = LoadForCli(f);
    window_nll = [&](const std::vector<int32_t>& w) { return ModelWindowNll(*model, w); };
  }
  double nll = 0;
  long long scored = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (long long c = 0; c < chunks; ++c) {
    const std::vector<int32_t> window(ids.begin() + c * ctx, ids.begin() + (c + 1) * ctx);
    nll += window_nll(window);
    scored += ctx - 1;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[ppl] window %lld/%lld: running ppl %.3f (%.1f s)\n", c + 1, chunks, std::exp(nll / scored), el);
  }
  nlohmann::json j = {{"ppl", std::exp(nll / scored)}, {"nll_per_token", nll / scored}, {"windows", chunks},
                      {"ctx", ctx}, {"scored_tokens", scored}, {"file_tokens", ids.size()}, {"source", source}};
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace dsmesh

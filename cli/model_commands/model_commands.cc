// The model's single-process commands (cli/model_commands/model_commands.h): `logits`, `generate` (greedy)
// and `make-tiny`. Flags are stable: tests and users call them.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/model_commands/model_commands.h"

#include "cli/model_commands/load_model.h"
#include "common/flags.h"
#include "common/safetensors.h"
#include "kernels/cpu/argmax.h"
#include "model/model.h"

namespace dsmesh {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int RunLogits(const std::vector<std::string>& args) {
  Flags f(args, {"model", "tokens", "out", "threads", "device", "enforce-eager", "kv-cache-dtype"}, {"enforce-eager"});
  std::vector<int32_t> tokens = ParseIntList("tokens", f.Require("tokens"), "integer token id");
  std::string out_path = f.Require("out");
  auto model = LoadForCli(f);
  auto state = model->NewState();
  auto out = model->Forward({{state.get(), tokens, /*all_logits=*/true}});
  SafetensorsWriter w;
  w.Add("logits", out[0].logits);
  w.Write(out_path);
  return 0;
}

int RunGenerate(const std::vector<std::string>& args) {
  Flags f(args, {"model", "tokens", "max-new-tokens", "threads", "ignore-eos", "device", "enforce-eager", "kv-cache-dtype"},
          {"ignore-eos", "enforce-eager"});
  std::vector<int32_t> prompt = ParseIntList("tokens", f.Require("tokens"), "integer token id");
  long long max_new = f.GetInt("max-new-tokens", 16);
  if (max_new < 0) throw UsageError("--max-new-tokens must be >= 0");
  const bool ignore_eos = f.GetBool("ignore-eos", false);
  auto model = LoadForCli(f);
  const int64_t vocab = model->config().vocab_size, eos = model->config().eos_token_id;
  auto argmax = [&](const Tensor& logits) { return Argmax(logits.as<float>(), vocab); };
  auto state = model->NewState();
  std::vector<int32_t> generated;
  double t0 = Now(), t_prefill = t0, t_end = t0;
  if (max_new > 0) {
    auto out = model->Forward({{state.get(), prompt, false}});
    generated.push_back(argmax(out[0].logits));
    t_prefill = Now();
    while ((long long)generated.size() < max_new && (ignore_eos || generated.back() != eos)) {
      out = model->Forward({{state.get(), {generated.back()}, false}});
      generated.push_back(argmax(out[0].logits));
    }
    t_end = Now();
  }
  std::string json = "{\"tokens\": [";
  for (size_t i = 0; i < generated.size(); ++i) json += (i ? ", " : "") + std::to_string(generated[i]);
  std::cout << json << "]}" << std::endl;
  const size_t decoded = generated.empty() ? 0 : generated.size() - 1;
  std::fprintf(stderr, "prefill %zu tokens: %.1f ms; decode %zu tokens: %.1f ms (%.1f tokens/s)\n", prompt.size(),
               (t_prefill - t0) * 1e3, decoded, (t_end - t_prefill) * 1e3,
               decoded ? decoded / (t_end - t_prefill) : 0.0);
  return 0;
}

void MakeTinyModel(const std::string& dir, uint64_t seed, const TinyModelSpec& spec) {
  WriteTinyModel(dir, seed, spec);
  // Ship the real DeepSeek tokenizer beside the weights when this checkout has it, so the demo serves text.
  const char* root = std::getenv("DSMESH_ROOT");
  std::string tok = std::string(root ? root : ".") + "/common/tokenizer/data/deepseek_v4";
  struct stat st;
  if (stat(tok.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::string cmd = "cp -r '" + tok + "'/. '" + dir + "'/";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("make-tiny: copying tokenizer files from " + tok + " failed");
    std::cerr << "make-tiny: copied the DeepSeek-V4 tokenizer files from " << tok << std::endl;
  } else {
    std::cerr << "make-tiny: no tokenizer copied (" << tok << " not found; set DSMESH_ROOT to the repository)" << std::endl;
  }
}

int RunMakeTiny(const std::vector<std::string>& args) {
  Flags f(args, {"out", "seed", "vision", "mtp-layers", "vocab", "sliding-layers"}, {"vision"});
  std::string dir = f.Require("out");
  long long seed = f.GetInt("seed", 0);
  TinyModelSpec spec;
  spec.vision = f.GetBool("vision", false);  // a tiny vision tower too (DeepSeek-V4-Flash-Vision layout)
  // MTP blocks (num_nextn_predict_layers): draft step i uses block i, so 3 blocks serve 3 drafts as trained.
  const long long mtp_layers = f.GetInt("mtp-layers", spec.num_mtp_layers);
  if (mtp_layers < 0 || mtp_layers > 8) throw UsageError("--mtp-layers: expected 0..8, got " + std::to_string(mtp_layers));
  spec.num_mtp_layers = static_cast<int>(mtp_layers);
  // A smaller variant for fixtures whose reference has no compressor (tests/golden/make_image_rows_fixture.py):
  // a small vocabulary and only sliding layers, no MTP block.
  spec.vocab_size = f.GetInt("vocab", spec.vocab_size);
  if (spec.vocab_size < 2) throw UsageError("--vocab must be >= 2");
  if (long long n = f.GetInt("sliding-layers", 0); n > 0) {
    spec.compress_ratios.assign(static_cast<size_t>(n), 0);
    spec.num_mtp_layers = 0;
  }
  MakeTinyModel(dir, static_cast<uint64_t>(seed), spec);
  std::cout << "wrote " << dir << " (seed " << seed << ")" << std::endl;
  return 0;
}

}  // namespace dsmesh

// CPU decode speed of a model (default: the make-tiny model, written to a temporary directory), printed
// beside the target the issue sets for the tiny model: > 20 tokens/s on 2 cores.
//
//   bazel run //model:decode_benchmark -- [--model DIR] [--prompt 64] [--steps 64] [--batch 1,4] [--threads N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/program.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/thread_pool.h"
#include "model/model.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int Main(int argc, char** argv) {
  Flags f(std::vector<std::string>(argv + 1, argv + argc), {"model", "prompt", "steps", "batch", "threads"});
  std::string dir = f.Get("model");
  if (dir.empty()) {
    dir = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/dsmesh_decode_benchmark_tiny";
    WriteTinyModel(dir, 0);
  }
  const int prompt = static_cast<int>(f.GetInt("prompt", 64)), steps = static_cast<int>(f.GetInt("steps", 64));
  const int threads = static_cast<int>(f.GetInt("threads", 0));
  std::vector<int> batches;
  for (const std::string& b : {f.Get("batch", "1,4")}) {
    size_t i = 0;
    while (i < b.size()) {
      size_t j = b.find(',', i);
      if (j == std::string::npos) j = b.size();
      batches.push_back(std::stoi(b.substr(i, j - i)));
      i = j + 1;
    }
  }
  auto model = LoadModel(dir, ShardSpec{}, MakeCpuBackend(threads));
  const int64_t V = model->config().vocab_size;
  std::printf("model %s: %d layers, hidden %lld, vocab %lld; %d CPU threads\n", dir.c_str(),
              model->config().num_layers, (long long)model->config().hidden_size, (long long)V, cpu::CpuThreads());
  for (int batch : batches) {
    std::vector<std::unique_ptr<SequenceState>> states;
    std::vector<SequenceStep> step;
    for (int s = 0; s < batch; ++s) {
      states.push_back(model->NewState());
      std::vector<int32_t> toks(prompt);
      for (int i = 0; i < prompt; ++i) toks[i] = static_cast<int32_t>((i * 7919 + s * 104729 + 3) % V);
      step.push_back({states.back().get(), toks, false});
    }
    double t0 = Now();
    model->Forward(step);
    double t1 = Now();
    for (int i = 0; i < steps; ++i) {
      for (int s = 0; s < batch; ++s) step[s].tokens = {static_cast<int32_t>((i * 31 + s) % V)};
      model->Forward(step);
    }
    double t2 = Now();
    const double tps = batch * steps / (t2 - t1);
    std::printf("batch %d: prefill %d tokens/seq %.1f ms; decode %.2f ms/step, %.1f tokens/s%s\n", batch, prompt,
                (t1 - t0) * 1e3, (t2 - t1) * 1e3 / steps, tps,
                batch == 1 ? "   (target for the tiny model: > 20 tokens/s on 2 cores)" : "");
  }
  return 0;
}

}  // namespace
}  // namespace dsmesh

int main(int argc, char** argv) {
  return dsmesh::RunProgram("decode_benchmark", nullptr, [&] { return dsmesh::Main(argc, argv); });
}

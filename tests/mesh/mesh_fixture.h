// Shared pieces of the end-to-end mesh tests: a tiny model that shards at world 1, 2 and 4, the real
// binaries from runfiles, an in-process single-rank reference (the oracle the mesh must reproduce), and
// logits comparison.
#pragma once

#include <array>
#include <cstdio>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "coordinator/kv_blocks.h"
#include "cli/launcher/local_mesh.h"
#include "common/mesh/mesh_client.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh::mesh_test {

// The model tests' small spec shards at world 1, 2 and 4 (o_groups 4) and crosses every window kind.
inline TinyModelSpec ShardableSpec() { return testing_util::SmallSpec(); }

inline std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  if (!dir) ADD_FAILURE() << "TEST_SRCDIR is unset: run this test with bazel test";
  return std::string(dir ? dir : ".") + "/dsmesh/" + path;
}

using testing_util::TempDir;

inline std::string TinyModelDir() {
  static std::string dir = [] {
    std::string d = TempDir("tiny_tp4");
    WriteTinyModel(d, 11, ShardableSpec());
    return d;
  }();
  return dir;
}

inline std::vector<int32_t> Tokens(int n, uint32_t seed, int vocab = 512) {
  std::vector<int32_t> t(n);
  uint32_t x = seed * 2654435761u + 99u;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = static_cast<int32_t>(2 + (x >> 8) % (vocab - 2));  // avoid bos/eos
  }
  return t;
}

// Runs a shell command; returns what it wrote to stdout and sets *rc to its wait status.
inline std::string Capture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  *rc = pclose(p);
  return out;
}

inline LocalMeshOptions MeshOptions(int world, std::vector<std::string> coordinator_args = {}) {
  LocalMeshOptions o;
  o.coordinator_bin = Runfile("coordinator/dsmesh-coordinator");
  o.worker_bin = Runfile("worker/dsmesh-worker");
  o.model_dir = TinyModelDir();
  o.world = world;
  o.kv_memory = "64M";
  o.coordinator_args = std::move(coordinator_args);
  o.coordinator_args.insert(o.coordinator_args.end(), {"--register-timeout-s", "60", "--max-model-len", "1024"});
  return o;
}

// --kv-memory for a worker whose state pool holds exactly `blocks` blocks beside the state slots the
// coordinator asks for (StateSlotsFor), on the tiny model without speculation.
inline std::string KvMemoryForBlocks(int blocks, int max_num_seqs = 4) {
  auto m = LoadModel(TinyModelDir(), ShardSpec{0, 1}, MakeCpuBackend(1));
  StatePoolOptions o;
  o.slots = StateSlotsFor(max_num_seqs);
  o.max_speculative_tokens = 0;
  o.external = true;
  const StatePool& p = m->ConfigureStatePool(o);
  return std::to_string(o.slots * p.slot_bytes() + blocks * p.block_bytes());
}

// The oracle: the same model in this process, one rank, greedy, no batching.
class Reference {
 public:
  Reference() : model_(LoadModel(TinyModelDir(), ShardSpec{0, 1}, MakeCpuBackend(1))) {}
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) {
    auto state = model_->NewState();
    std::vector<int32_t> out;
    std::vector<int32_t> feed = prompt;
    for (int i = 0; i < n; ++i) {
      auto res = model_->Forward({{state.get(), feed, false}});
      const float* p = res[0].logits.as<float>();
      const int64_t vocab = model_->config().vocab_size;
      int32_t best = 0;
      for (int64_t v = 1; v < vocab; ++v)
        if (p[v] > p[best]) best = static_cast<int32_t>(v);
      out.push_back(best);
      feed = {best};
    }
    return out;
  }

 private:
  std::unique_ptr<Model> model_;
};

inline GenerateRequest Greedy(const std::vector<int32_t>& prompt, int max_tokens, const std::string& id = "r") {
  GenerateRequest g;
  g.set_request_id(id);
  for (int32_t t : prompt) g.add_prompt_token_ids(t);
  g.mutable_sampling()->set_temperature(0);
  g.mutable_sampling()->set_max_tokens(max_tokens);
  g.mutable_sampling()->set_ignore_eos(true);
  return g;
}

// max |a - b| / max |b| over a row.
inline double RelDiff(const LogitsRow& a, const LogitsRow& b) {
  double num = 0, den = 0;
  for (int i = 0; i < b.values_size(); ++i) {
    num = std::max(num, std::abs(double(a.values(i)) - b.values(i)));
    den = std::max(den, std::abs(double(b.values(i))));
  }
  return den > 0 ? num / den : num;
}

}  // namespace dsmesh::mesh_test

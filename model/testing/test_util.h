// Helpers shared by the model tests: a small tiny-model spec, temporary directories, logits comparison,
// and an in-process Communicator that lets N threads act as N tensor-parallel ranks.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/communicator.h"
#include "common/tensor.h"
#include "model/model.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace testing_util {

// Small enough that a 300-token forward takes well under a second, but with windows, CSA windows and
// two HCA windows all crossed by a 300-token prompt.
inline TinyModelSpec SmallSpec() {
  TinyModelSpec s;
  s.vocab_size = 512;
  s.hidden_size = 64;
  s.compress_ratios = {0, 4, 128, 4};
  s.num_heads = 4;
  s.head_dim = 32;
  s.rope_dim = 8;
  s.q_lora_rank = 32;
  s.o_groups = 4;  // shards at world 1, 2 and 4
  s.o_lora_rank = 16;
  s.sliding_window = 8;
  s.index_n_heads = 32;
  s.index_head_dim = 16;
  s.index_topk = 4;
  s.n_routed_experts = 8;
  s.num_experts_per_tok = 2;
  s.moe_intermediate_size = 32;
  s.num_hash_layers = 1;
  return s;
}

// SmallSpec at sizes where the CUDA backend takes its EXL3 decode kernels: the routed experts the
// single-launch MoE kernel, the linears the GEMV (hidden and intermediate multiples of 128).
inline TinyModelSpec SmallExl3Spec() {
  TinyModelSpec s = SmallSpec();
  s.vocab_size = 1024;
  s.hidden_size = 256;
  s.moe_intermediate_size = 256;
  s.num_heads = 4;
  s.head_dim = 64;
  s.rope_dim = 16;
  s.q_lora_rank = 128;
  s.o_groups = 2;
  s.o_lora_rank = 128;
  s.sliding_window = 16;
  s.index_topk = 8;
  return s;
}

inline std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) std::abort();
  return dir;
}

inline std::vector<int32_t> Tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = static_cast<int32_t>((x >> 8) % vocab);
  }
  return t;
}

// max |a-b| / max |b| over one row each.
inline double RelMaxDiff(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

// ||a-b|| / ||b||
inline double RelL2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// N threads, one collective at a time; sums in rank order so results are deterministic.
class ThreadGroup {
 public:
  explicit ThreadGroup(int world) : world_(world), inputs_(world) {}

  void Collective(int rank, const float* in, size_t n, bool gather, float* out) {
    std::unique_lock<std::mutex> lock(mu_);
    const long generation = generation_;
    inputs_[rank].assign(in, in + n);
    if (++arrived_ == world_) {
      result_.assign(gather ? n * world_ : n, 0.0f);
      for (int r = 0; r < world_; ++r)
        for (size_t i = 0; i < n; ++i) {
          if (gather) result_[r * n + i] = inputs_[r][i];
          else result_[i] += inputs_[r][i];
        }
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
    std::copy(result_.begin(), result_.end(), out);
  }

 private:
  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  long generation_ = 0;
  std::vector<std::vector<float>> inputs_;
  std::vector<float> result_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup* group, int rank, int world) : group_(group), rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void AllReduceSum(float* data, size_t n) override { group_->Collective(rank_, data, n, false, data); }
  void AllGather(const float* in, size_t n, float* out) override { group_->Collective(rank_, in, n, true, out); }
  void Broadcast(void*, size_t, int) override {}

 private:
  ThreadGroup* group_;
  int rank_, world_;
};

// Per row logits of a prompt (every row) and `steps` decode steps fed `feed` (the first run appends its
// own argmaxes; later runs replay them), with the model's state rows stored as `dtype`.
inline std::vector<std::vector<float>> LogitsWithStoredRows(Model& model, KvCacheDtype dtype,
                                                            const std::vector<int32_t>& prompt,
                                                            std::vector<int32_t>* feed, int steps) {
  StatePoolOptions po;
  po.kv_dtype = dtype;
  if (model.ConfigureStatePool(po).kv_dtype() != dtype)
    throw std::runtime_error(std::string("the state pool did not take --kv-cache-dtype ") + KvCacheDtypeName(dtype));
  const int64_t V = model.config().vocab_size;
  auto st = model.NewState();
  std::vector<std::vector<float>> rows;
  Tensor lg = model.Forward({{st.get(), prompt, true}})[0].logits;
  for (int64_t r = 0; r < lg.shape[0]; ++r) rows.emplace_back(lg.as<float>() + r * V, lg.as<float>() + (r + 1) * V);
  for (int s = 0; s < steps; ++s) {
    if (static_cast<int>(feed->size()) <= s) {
      const std::vector<float>& last = rows.back();
      feed->push_back(static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
    }
    lg = model.Forward({{st.get(), {(*feed)[s]}, false}})[0].logits;
    rows.emplace_back(lg.as<float>(), lg.as<float>() + V);
  }
  return rows;
}

// Rel L2 per row of `got` against `want`: median, mean, worst.
struct RowErrors {
  double median = 0, mean = 0, worst = 0;
};
inline RowErrors RowErrorsOf(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  std::vector<double> e;
  for (size_t r = 0; r < want.size() && r < got.size(); ++r)
    e.push_back(RelL2(got[r].data(), want[r].data(), static_cast<int64_t>(want[r].size())));
  RowErrors out;
  if (e.empty()) return out;
  for (double v : e) out.mean += v / e.size();
  std::sort(e.begin(), e.end());
  out.median = e[e.size() / 2];
  out.worst = e.back();
  return out;
}

// The image rows of tokens [from, to) of the prompt, re-indexed to that step.
inline StepImageRows SliceImageRows(const StepImageRows& all, int64_t from, int64_t to) {
  StepImageRows out;
  std::vector<int64_t> picked;
  for (size_t i = 0; i < all.rows.size(); ++i)
    if (all.rows[i] >= from && all.rows[i] < to) picked.push_back(static_cast<int64_t>(i));
  if (picked.empty()) return out;
  const int64_t D = all.embeddings.shape[1];
  out.embeddings = AllocateTensor(DType::kF32, {static_cast<int64_t>(picked.size()), D});
  for (size_t k = 0; k < picked.size(); ++k) {
    out.rows.push_back(all.rows[picked[k]] - from);
    std::copy_n(all.embeddings.as<float>() + picked[k] * D, D, out.embeddings.as<float>() + k * D);
  }
  for (const StepImageRows::Span& s : all.spans)
    if (s.first >= from && s.last < to) out.spans.push_back({s.first - from, s.last - from});
  return out;
}

}  // namespace testing_util
}  // namespace dsmesh

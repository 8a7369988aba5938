// Sampling on the backend (Backend::SampleRows, the path that keeps logits on the device) against
// sampling on the host from full logits, driven through the step executor on the tiny model: a batch
// of greedy, seeded-sampled (temperature, top_k, top_p, min_p, logprobs) and greedy-speculative
// sequences yields the same tokens and logprobs both ways, the rows went where the counters say, and a
// step that needs the host (penalties, raw logits) goes there.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"
#include "worker/step_executor.h"

namespace dsmesh {
namespace {

using namespace testing_util;

struct Request {
  SamplingParams params;
  uint64_t seed = 0;
  int speculative = 0;
  std::vector<int32_t> prompt;
};

// What a sequence produced: its tokens and the logprobs that came with them.
struct Produced {
  std::vector<int32_t> tokens;
  std::vector<std::string> logprobs;  // TokenLogprobs, serialized
};

class DeviceSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TinyModelSpec spec = SmallSpec();
    spec.num_mtp_layers = 1;
    const std::string dir = TempDir("device_sampling_test_model");
    WriteTinyModel(dir, 31, spec);
    comm_.Attach(std::make_unique<LocalCommunicator>());
    model_ = LoadModel(dir, ShardSpec{}, MakeCpuBackend(1), &comm_);
  }

  // The coordinator's loop for a batch of requests, `steps` steps (speculative ones feed back their drafts).
  std::vector<Produced> Run(bool device, const std::vector<Request>& reqs, int steps,
                            StepExecutor::SamplingCounts* counts, bool return_logits = false) {
    StepExecutor ex(model_.get(), &comm_);
    ex.set_device_sampling(device);
    const size_t n = reqs.size();
    std::vector<std::vector<int32_t>> tokens(n), drafts(n);
    std::vector<int64_t> computed(n, 0);
    std::vector<Produced> out(n);
    for (size_t i = 0; i < n; ++i) tokens[i] = reqs[i].prompt;
    for (int step = 0; step < steps; ++step) {
      StepPlan plan;
      plan.set_step_id(step);
      for (size_t i = 0; i < n; ++i) {
        SequencePlan* sp = plan.add_seqs();
        sp->set_seq_id(i + 1);
        sp->set_start_pos(computed[i]);
        sp->set_sample(true);
        sp->set_return_logits(return_logits);
        if (step == 0) {
          sp->set_is_new(true);
          sp->set_prompt_len(reqs[i].prompt.size());
          *sp->mutable_sampling() = reqs[i].params;
          sp->set_seed(reqs[i].seed);
          sp->set_num_speculative_tokens(reqs[i].speculative);
        }
        sp->mutable_tokens()->Add(tokens[i].begin() + computed[i], tokens[i].end());
        sp->mutable_draft_tokens()->Add(drafts[i].begin(), drafts[i].end());
      }
      const StepResult r = ex.Run(plan);
      for (size_t i = 0; i < n; ++i) {
        const SequenceResult& sr = r.seqs(i);
        computed[i] = tokens[i].size() + sr.num_accepted_drafts();
        tokens[i].insert(tokens[i].end(), sr.token_ids().begin(), sr.token_ids().end());
        out[i].tokens.insert(out[i].tokens.end(), sr.token_ids().begin(), sr.token_ids().end());
        if (sr.has_logprobs()) out[i].logprobs.push_back(sr.logprobs().SerializeAsString());
        drafts[i].assign(sr.next_drafts().begin(), sr.next_drafts().end());
      }
    }
    *counts = ex.sampling_counts();
    return out;
  }

  static Request Greedy(std::vector<int32_t> prompt, int speculative = 0) {
    Request q;
    q.params.set_temperature(0);
    q.speculative = speculative;
    q.prompt = std::move(prompt);
    return q;
  }
  static Request Sampled(std::vector<int32_t> prompt, float t, int top_k, float top_p, float min_p, uint64_t seed,
                         int logprobs) {
    Request q;
    q.params.set_temperature(t);
    q.params.set_top_k(top_k);
    q.params.set_top_p(top_p);
    q.params.set_min_p(min_p);
    q.params.set_logprobs(logprobs);
    q.params.set_want_logprobs(logprobs > 0);
    q.seed = seed;
    q.prompt = std::move(prompt);
    return q;
  }

  MeshCommunicator comm_{0, 1};
  std::unique_ptr<Model> model_;
};

TEST_F(DeviceSamplingTest, GreedySampledAndSpeculativeBatchSameTokensOnBothPaths) {
  const int vocab = model_->config().vocab_size;
  const std::vector<Request> reqs = {
      Greedy(Tokens(19, vocab, 1)),
      Sampled(Tokens(7, vocab, 2), 0.8f, 0, 0.9f, 0.0f, 1234, 0),
      Sampled(Tokens(12, vocab, 3), 1.0f, 20, 1.0f, 0.05f, 99, 5),
      Sampled(Tokens(3, vocab, 4), 1.3f, 0, 1.0f, 0.0f, 7, 20),
      Greedy(Tokens(11, vocab, 5), /*speculative=*/3),
  };
  StepExecutor::SamplingCounts on, off;
  const std::vector<Produced> device = Run(true, reqs, 40, &on);
  const std::vector<Produced> host = Run(false, reqs, 40, &off);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(device[i].tokens, host[i].tokens) << "request " << i;
    EXPECT_EQ(device[i].logprobs, host[i].logprobs) << "request " << i;
    EXPECT_GE(device[i].tokens.size(), 40u);
  }
  EXPECT_EQ(device[3].logprobs.size(), 40u);
  // Rows: every step samples one row per plain sequence and 1 + 3 drafts for the speculative one (from
  // its second step).
  EXPECT_EQ(on.host_rows, 0);
  EXPECT_EQ(on.device_rows, 4 * 40 + 1 + 4 * 39);
  EXPECT_EQ(off.device_rows, 0);
  EXPECT_EQ(off.host_rows, on.device_rows);
}

TEST_F(DeviceSamplingTest, PenaltiesOrRawLogitsSendTheWholeStepToTheHost) {
  const int vocab = model_->config().vocab_size;
  Request penalized = Sampled(Tokens(9, vocab, 6), 0.9f, 0, 1.0f, 0.0f, 5, 0);
  penalized.params.set_presence_penalty(0.5f);
  StepExecutor::SamplingCounts counts;
  Run(true, {Greedy(Tokens(5, vocab, 7)), penalized}, 6, &counts);
  EXPECT_EQ(counts.device_rows, 0);
  EXPECT_EQ(counts.host_rows, 12);
  Run(true, {Greedy(Tokens(5, vocab, 7))}, 3, &counts, /*return_logits=*/true);
  EXPECT_EQ(counts.device_rows, 0);
  EXPECT_EQ(counts.host_rows, 3);
}

}  // namespace
}  // namespace dsmesh

// Speculative decoding in the step executor, driven the way the coordinator drives it: greedy output with
// MTP drafts verified (and the state rolled back after every rejection) equals plain greedy decoding over
// 200+ tokens, with the real MTP drafts, with drafts forced to be right for 0..3 positions per step, and
// with the draft policy withholding 0..3 drafts (the MTP block skipping steps). Simulated acceptance (the
// bench's) passes exactly the planned drafts, and only on an executor the bench allowed it.
#include <gtest/gtest.h>

#include <functional>

#include "kernels/cpu/cpu_backend.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"
#include "worker/step_executor.h"

namespace dsmesh {
namespace {

using namespace testing_util;


class StepExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override { Load(1); }
  // The tiny model with `mtp_layers` MTP blocks (the same main model and mtp.0 for every count).
  void Load(int mtp_layers) {
    TinyModelSpec spec = SmallSpec();
    spec.num_mtp_layers = mtp_layers;
    const std::string dir = TempDir("step_executor_test_model_" + std::to_string(mtp_layers));
    WriteTinyModel(dir, 23, spec);
    model_.reset();
    comm_.Attach(std::make_unique<LocalCommunicator>());
    model_ = LoadModel(dir, ShardSpec{}, MakeCpuBackend(1), &comm_);
  }

  std::vector<int32_t> PlainGreedy(const std::vector<int32_t>& prompt, int n) {
    auto st = model_->NewState();
    std::vector<int32_t> out, feed = prompt;
    while ((int)out.size() < n) {
      Tensor l = model_->Forward({{st.get(), feed, false}})[0].logits;
      const float* p = l.as<float>();
      int32_t best = static_cast<int32_t>(std::max_element(p, p + model_->config().vocab_size) - p);
      out.push_back(best);
      feed = {best};
    }
    return out;
  }

  // The coordinator's loop for one greedy request with k drafts per step.
  // `withheld(step)`: the draft policy's drafts_withheld; `simulate(step)`: simulated acceptance (-1: none).
  std::vector<int32_t> Speculative(StepExecutor& ex, const std::vector<int32_t>& prompt, int n, int k,
                                   std::vector<int>* accepted, std::function<int(int)> withheld = nullptr,
                                   std::function<int(int)> simulate = nullptr) {
    std::vector<int32_t> tokens = prompt, drafts;
    int64_t computed = 0;
    for (int step = 0; (int)tokens.size() - (int)prompt.size() < n; ++step) {
      StepPlan plan;
      plan.set_step_id(step);
      SequencePlan* sp = plan.add_seqs();
      sp->set_seq_id(1);
      sp->set_start_pos(computed);
      sp->set_sample(true);
      if (step == 0) {
        sp->set_is_new(true);
        sp->set_prompt_len(prompt.size());
        sp->mutable_sampling()->set_temperature(0);
        sp->set_num_speculative_tokens(k);
      }
      sp->mutable_tokens()->Add(tokens.begin() + computed, tokens.end());
      sp->mutable_draft_tokens()->Add(drafts.begin(), drafts.end());
      const int withhold = withheld ? withheld(step) : 0;
      sp->set_drafts_withheld(withhold);
      if (simulate && simulate(step) >= 0) sp->mutable_simulated_acceptance()->set_accepted_drafts(simulate(step));
      StepResult r = ex.Run(plan);
      const SequenceResult& sr = r.seqs(0);
      computed = tokens.size() + sr.num_accepted_drafts();
      if (step > 0) accepted->push_back(sr.num_accepted_drafts());
      tokens.insert(tokens.end(), sr.token_ids().begin(), sr.token_ids().end());
      drafts.assign(sr.next_drafts().begin(), sr.next_drafts().end());
      EXPECT_EQ(static_cast<int>(drafts.size()), k - withhold);
      // A step whose drafts are all withheld pays nothing for speculation: no MTP pass runs.
      if (withhold >= k) EXPECT_EQ(r.draft_seconds(), 0.0) << "step " << step;
    }
    return std::vector<int32_t>(tokens.begin() + prompt.size(), tokens.begin() + prompt.size() + n);
  }

  MeshCommunicator comm_{0, 1};
  std::unique_ptr<Model> model_;
};

TEST_F(StepExecutorTest, GreedyWithMtpDraftsEqualsPlainGreedy) {
  const auto prompt = Tokens(37, 512, 4);
  StepExecutor ex(model_.get(), &comm_);
  std::vector<int> accepted;
  EXPECT_EQ(Speculative(ex, prompt, 210, 3, &accepted), PlainGreedy(prompt, 210));
}

// mtp.0..2 draft steps 1..3: different drafts (and acceptance) than the one reused block, same output.
TEST_F(StepExecutorTest, GreedyWithThreeMtpBlocksEqualsPlainGreedy) {
  const auto prompt = Tokens(37, 512, 4);
  std::vector<int> accepted;
  // The hook only watches: the drafts of both runs, in order (a random model accepts ~nothing, so the
  // acceptance counts would not tell the two apart).
  std::vector<int32_t> drafts_one, drafts_three;
  auto watch = [](std::vector<int32_t>* log) {
    return [log](uint64_t, int64_t, std::vector<int32_t>* d) { log->insert(log->end(), d->begin(), d->end()); };
  };
  StepExecutor one(model_.get(), &comm_);
  one.set_draft_hook(watch(&drafts_one));
  const auto with_one = Speculative(one, prompt, 210, 3, &accepted);
  Load(3);
  ASSERT_EQ(model_->config().num_mtp_layers, 3);
  StepExecutor three(model_.get(), &comm_);
  three.set_draft_hook(watch(&drafts_three));
  EXPECT_EQ(Speculative(three, prompt, 210, 3, &accepted), PlainGreedy(prompt, 210));
  EXPECT_EQ(with_one, PlainGreedy(prompt, 210));
  ASSERT_EQ(drafts_one.size(), drafts_three.size());
  int same_first = 0, same_later = 0;
  for (size_t i = 0; i < drafts_one.size(); ++i) (i % 3 == 0 ? same_first : same_later) += drafts_one[i] == drafts_three[i];
  EXPECT_EQ(same_first, static_cast<int>(drafts_one.size() / 3)) << "draft 1 comes from mtp.0 in both";
  EXPECT_LT(same_later, static_cast<int>(drafts_one.size() / 3)) << "drafts 2 and 3 come from mtp.1 and mtp.2";
}

TEST_F(StepExecutorTest, ForcedAcceptanceOfEveryCountEqualsPlainGreedy) {
  const auto prompt = Tokens(21, 512, 9);
  const int n = 220;
  const auto want = PlainGreedy(prompt, n + 8);
  StepExecutor ex(model_.get(), &comm_);
  int calls = 0;
  // Drafts right for (call % 4) positions, then wrong: every acceptance count 0..3 and its rollback.
  ex.set_draft_hook([&](uint64_t, int64_t position, std::vector<int32_t>* d) {
    const int right = calls++ % 4;
    for (int i = 0; i < (int)d->size(); ++i) {
      const int32_t truth = want[position + i - prompt.size()];
      (*d)[i] = i < right ? truth : (truth + 1) % 512;
    }
  });
  std::vector<int> accepted;
  EXPECT_EQ(Speculative(ex, prompt, n, 3, &accepted), std::vector<int32_t>(want.begin(), want.begin() + n));
  ASSERT_GT(accepted.size(), 50u);
  for (size_t i = 0; i < accepted.size(); ++i) EXPECT_EQ(accepted[i], static_cast<int>(i % 4)) << "step " << i + 1;
}

TEST_F(StepExecutorTest, WithheldDraftsAreNotProposedAndGreedyStillEqualsPlain) {
  const auto prompt = Tokens(29, 512, 6);
  StepExecutor ex(model_.get(), &comm_);
  std::vector<int> accepted;
  // 0..3 withheld, and runs of steps with no drafts at all (the MTP window catches up when drafting resumes).
  const auto withheld = [](int step) { return step % 40 < 20 ? step % 4 : 3; };
  EXPECT_EQ(Speculative(ex, prompt, 210, 3, &accepted, withheld), PlainGreedy(prompt, 210));
}

TEST_F(StepExecutorTest, SimulatedAcceptanceIsRefusedUnlessTheBenchAllowedIt) {
  const auto prompt = Tokens(11, 512, 2);
  StepExecutor serving(model_.get(), &comm_);
  std::vector<int> accepted;
  try {
    Speculative(serving, prompt, 20, 3, &accepted, nullptr, [](int step) { return step > 0 ? 2 : -1; });
    FAIL() << "a serving executor ran a simulated plan";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bench-only"), std::string::npos) << e.what();
  }
}

TEST_F(StepExecutorTest, SimulatedAcceptancePassesExactlyThePlannedDrafts) {
  const auto prompt = Tokens(17, 512, 3);
  StepExecutor ex(model_.get(), &comm_);
  ex.set_simulated_acceptance_allowed(true);
  std::vector<int> accepted;
  const auto plan = [](int step) { return step == 0 ? -1 : (step * 7) % 5; };  // 0..4: 4 is capped at 3 drafts
  const auto out = Speculative(ex, prompt, 150, 3, &accepted, nullptr, plan);
  ASSERT_GT(accepted.size(), 40u);
  for (size_t i = 0; i < accepted.size(); ++i) EXPECT_EQ(accepted[i], std::min(plan(i + 1), 3)) << "step " << i + 1;
  EXPECT_EQ(out.size(), 150u);
}

}  // namespace
}  // namespace dsmesh

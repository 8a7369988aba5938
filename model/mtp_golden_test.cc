// The MTP block and greedy drafting against an independent torch implementation of DeepSeek's reference
// MTPBlock (tests/golden/make_mtp_fixture.py, fixture tests/golden/mtp_v4): a random MTP block on top of
// the tiny_v4 golden model. Our main forward runs the prompt in chunks (so the MTP window catches up in
// steps, skips rows and wraps its ring), then Draft is called at each recorded length and its 3 draft
// logits are compared with the reference's, which started from transformers' residual rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/testing/test_util.h"

namespace dsmesh {
namespace {

using testing_util::RelL2;

std::vector<int64_t> Ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (float v : ToFloatVector(t)) out.push_back(static_cast<int64_t>(v));
  return out;
}

TEST(MtpGoldenTest, DraftLogitsMatchReferenceMtpBlock) {
  const char* root = std::getenv("DSMESH_ROOT");
  ASSERT_TRUE(root && *root) << "DSMESH_ROOT is not set: run through ./dsmesh test (or export DSMESH_ROOT=<repo root>)";
  const std::string golden_dir = std::string(root) + "/tests/golden/";
  auto golden = SafetensorsFile::Open(golden_dir + "mtp_v4/golden_mtp.safetensors");
  auto tiny = SafetensorsFile::Open(golden_dir + "tiny_v4/golden.safetensors");
  auto model = LoadModel(golden_dir + "mtp_v4", ShardSpec{}, MakeCpuBackend());
  ASSERT_TRUE(model->has_mtp());
  const int64_t V = model->config().vocab_size;

  std::vector<int32_t> prompt;
  for (int64_t t : Ints(tiny->Get("input_ids"))) prompt.push_back(static_cast<int32_t>(t));
  const std::vector<int64_t> lengths = Ints(golden->Get("draft_lengths"));
  const std::vector<int64_t> next = Ints(golden->Get("next_tokens"));
  const std::vector<int64_t> drafts = Ints(golden->Get("draft_tokens"));
  const std::vector<float> want = ToFloatVector(golden->Get("draft_logits"));
  const int K = static_cast<int>(drafts.size() / lengths.size());
  ASSERT_EQ(want.size(), lengths.size() * K * V);

  auto st = model->NewState(K);
  int64_t done = 0;
  double worst = 0;
  int argmax_checked = 0;
  for (size_t c = 0; c < lengths.size(); ++c) {
    const int64_t L = lengths[c];
    model->Forward({{st.get(), std::vector<int32_t>(prompt.begin() + done, prompt.begin() + L), false}});
    done = L;
    // The chain is fed the reference's drafts, so a near-tie argmax cannot send the two chains apart;
    // the argmax itself is checked separately below.
    DraftRequest q{st.get(), static_cast<int32_t>(next[c]), K,
                   [&](int step, const float*) { return static_cast<int32_t>(drafts[c * K + step]); }, true};
    DraftResult r = model->Draft({q})[0];
    ASSERT_EQ(r.logits.shape, (std::vector<int64_t>{K, V}));
    for (int s = 0; s < K; ++s) {
      const float* got = r.logits.as<float>() + s * V;
      const float* ref = want.data() + (c * K + s) * V;
      const double e = RelL2(got, ref, V);
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-3) << "length " << L << " draft " << s + 1;
      // Greedy drafts agree wherever the reference's top-1 is clear of its top-2 by more than fp32 noise.
      std::vector<float> row(ref, ref + V);
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
      if (row[0] - row[1] > 1e-3f) {
        ++argmax_checked;
        EXPECT_EQ(std::max_element(got, got + V) - got, drafts[c * K + s]) << "length " << L << " draft " << s + 1;
      }
    }
  }
  std::printf("MTP draft logits vs reference: worst relative L2 over %zu calls x %d drafts = %.3g "
              "(argmax checked on %d rows)\n", lengths.size(), K, worst, argmax_checked);
}

}  // namespace
}  // namespace dsmesh

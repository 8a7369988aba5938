// The state cost per layer kind against docs/model-v4.md section 4's figures for V4-Flash (6880 B/token of
// compressed entries + indexer keys in bf16, ~5.6 MB of windows, ~11.6 MiB of partial windows per
// sequence), the fp8 layout's per-entry bytes (vLLM's: 128 fp8 + f32 scale per indexer key), and the
// f32 layout the forward stores today matching the model's own accounting.
#include "model/kv_layout.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"
#include "model/v4_flash_config.h"
#include "kernels/cpu/cpu_backend.h"

namespace dsmesh {
namespace {

TEST(KvLayout, V4FlashMatchesTheReferenceFigures) {
  const ModelConfig c = ModelConfig::FromJson(kV4FlashConfigJson, "v4-flash/config.json");
  const KvLayout bf16 = ComputeKvLayout(c, KvCacheDtype::kBf16);
  ASSERT_EQ(bf16.kinds.size(), 4u);
  EXPECT_EQ(bf16.kinds[0].layers, 2);   // sliding
  EXPECT_EQ(bf16.kinds[1].layers, 21);  // csa
  EXPECT_EQ(bf16.kinds[2].layers, 20);  // hca
  EXPECT_EQ(bf16.kinds[3].layers, 1);   // mtp
  EXPECT_DOUBLE_EQ(bf16.BytesPerToken(), 6880.0);
  int64_t windows = 0, partial = 0;
  for (const KvLayerKind& k : bf16.kinds) windows += k.window_bytes, partial += k.partial_bytes;
  EXPECT_EQ(windows, 44LL * 128 * 512 * 2);  // 43 layers + MTP
  EXPECT_EQ(partial, 21LL * (64 + 16) * 1024 + 20LL * 512 * 1024);  // 11.64 MiB

  const KvLayout fp8 = ComputeKvLayout(c, KvCacheDtype::kFp8);
  EXPECT_EQ(fp8.entry_bytes, 448 + 4 + 128);
  EXPECT_EQ(fp8.indexer_key_bytes, 132);
  EXPECT_NEAR(fp8.BytesPerToken(), 21 * (580.0 + 132.0) / 4 + 20 * 580.0 / 128, 1e-9);
  const int64_t context = 380000;
  for (const KvLayout* k : {&bf16, &fp8}) std::printf("%s", k->Describe(context).c_str());
  // 380K tokens: ~2.6 GB in bf16, ~1.5 GB in fp8, per sequence, on every rank (TP1 and TP8 alike).
  EXPECT_NEAR(bf16.SequenceBytes(context) / 1e9, 2.63, 0.02);
  EXPECT_NEAR(fp8.SequenceBytes(context) / 1e9, 1.47, 0.02);
}

TEST(KvLayout, F32LayoutIsWhatTheModelAccountsFor) {
  const std::string dir = testing_util::TempDir("kv_layout_tiny");
  WriteTinyModel(dir, 1, testing_util::SmallSpec());
  auto model = LoadModel(dir, ShardSpec{}, MakeCpuBackend());
  const KvLayout f32 = ComputeKvLayout(model->config(), KvCacheDtype::kF32, /*with_mtp=*/false);
  EXPECT_EQ(model->StateBytesPerToken(), static_cast<size_t>(std::ceil(f32.BytesPerToken())));
  EXPECT_EQ(model->StateFixedBytes(), static_cast<size_t>(f32.FixedBytesPerSequence()));
  // A fresh state (no entries yet) holds exactly the fixed bytes, without and with speculation's spare
  // slots and MTP state.
  for (int k : {0, 3}) {
    auto fresh = model->NewState(k);
    EXPECT_EQ(fresh->MemoryBytes(), model->StateFixedBytes(k)) << "k = " << k;
  }
  // The state pool's blocks hold exactly the layout's bytes per token.
  const StatePool& pool = model->state_pool();
  EXPECT_EQ(static_cast<double>(pool.block_bytes()), f32.BytesPerToken() * pool.block_tokens());
  // And the state a sequence actually holds after 300 tokens is what the layout says.
  auto st = model->NewState();
  model->Forward({{st.get(), testing_util::Tokens(300, 512, 1), false}});
  st->Reserve(300);
  EXPECT_LE(static_cast<double>(st->MemoryBytes()), f32.SequenceBytes(300) * 2 + 64 * 1024);
}

TEST(KvLayout, ParsesVllmSpellings) {
  EXPECT_EQ(ParseKvCacheDtype("auto"), KvCacheDtype::kF32);
  EXPECT_EQ(ParseKvCacheDtype("bf16"), KvCacheDtype::kBf16);
  EXPECT_EQ(ParseKvCacheDtype("fp8"), KvCacheDtype::kFp8);
  EXPECT_EQ(ParseKvCacheDtype("fp8_e4m3"), KvCacheDtype::kFp8);
  EXPECT_THROW(ParseKvCacheDtype("int4"), std::invalid_argument);
}

}  // namespace
}  // namespace dsmesh

// config.json in both spellings found in the wild maps onto one ModelConfig; bad configs are refused by name.
#include "model/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "model/rope.h"
#include "model/testing/test_util.h"
#include "model/v4_flash_config.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

const char* const kCheckpointSpelling = kV4FlashConfigJson;

std::string TransformersSpelling() {
  std::string types = "\"sliding_attention\", \"sliding_attention\"";
  for (int i = 0; i < 20; ++i) types += ", \"compressed_sparse_attention\", \"heavily_compressed_attention\"";
  types += ", \"compressed_sparse_attention\"";
  std::string mlp = "\"hash_moe\", \"hash_moe\", \"hash_moe\"";
  for (int i = 3; i < 43; ++i) mlp += ", \"moe\"";
  return R"({"model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
    "num_nextn_predict_layers": 1, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "partial_rotary_factor": 0.125, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
    "sliding_window": 128, "layer_types": [)" + types + R"(], "mlp_layer_types": [)" + mlp + R"(],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
    "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
                        "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                                     "original_max_position_embeddings": 65536, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "attention_factor": 1.0, "partial_rotary_factor": 0.125}},
    "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 2048,
    "scoring_func": "sqrtsoftplus", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "bos_token_id": 0, "eos_token_id": 1})";
}

TEST(ConfigTest, BothSpellingsDescribeTheSameModel) {
  ModelConfig a = ModelConfig::FromJson(kCheckpointSpelling, "ckpt/config.json");
  ModelConfig b = ModelConfig::FromJson(TransformersSpelling(), "hf/config.json");
  EXPECT_EQ(a.num_layers, 43);
  EXPECT_EQ(a.rope_dim, 64);
  EXPECT_EQ(b.rope_dim, 64);
  EXPECT_EQ(a.num_hash_layers, 3);
  EXPECT_EQ(b.num_hash_layers, 3);
  EXPECT_EQ(a.compress_ratios, b.compress_ratios);
  EXPECT_EQ(a.compress_ratios.size(), 44u);  // + the MTP block, sliding only
  EXPECT_EQ(a.attention_kind(0), AttentionKind::kSliding);
  EXPECT_EQ(a.attention_kind(2), AttentionKind::kCompressedSparse);
  EXPECT_EQ(a.attention_kind(3), AttentionKind::kHeavilyCompressed);
  EXPECT_EQ(a.attention_kind(43), AttentionKind::kSliding);
  EXPECT_EQ(a.mlp_kind(2), MlpKind::kHashMoe);
  EXPECT_EQ(a.mlp_kind(3), MlpKind::kRoutedMoe);
  EXPECT_TRUE(a.compress_yarn.enabled && b.compress_yarn.enabled);
  EXPECT_EQ(a.compress_yarn.factor, b.compress_yarn.factor);
  EXPECT_EQ(a.compress_yarn.original_max_position, 65536);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.compress_rope_theta, b.compress_rope_theta);
  EXPECT_EQ(LayerInvFreq(a, 2), LayerInvFreq(b, 2));
  EXPECT_EQ(LayerInvFreq(a, 0), PlainInvFreq(10000, 64));
}

TEST(ConfigTest, YarnInterpolatesOnlyTheLowFrequencies) {
  YarnScaling y;
  y.enabled = true;
  y.factor = 16;
  y.original_max_position = 65536;
  std::vector<float> plain = PlainInvFreq(160000, 64), yarn = YarnInvFreq(160000, 64, y);
  EXPECT_EQ(yarn.front(), plain.front());                   // fastest dims extrapolate unchanged
  EXPECT_NEAR(yarn.back(), plain.back() / 16, 1e-12);       // slowest dims are divided by the factor
}

TEST(ConfigTest, RefusesWhatItCannotRun) {
  auto error = [](const std::string& json) {
    try {
      ModelConfig::FromJson(json, "x/config.json");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(R"({"model_type": "deepseek_v3"})"),
            "x/config.json: unsupported model_type \"deepseek_v3\" (this build supports \"deepseek_v4\")");
  EXPECT_EQ(error("[1, 2]"), "x/config.json: config must be a JSON object");
  std::string no_hidden = kCheckpointSpelling;
  no_hidden.replace(no_hidden.find("\"hidden_size\": 4096,"), 20, "");
  EXPECT_EQ(error(no_hidden), "x/config.json: missing field \"hidden_size\"");
  std::string bad_score = kCheckpointSpelling;
  bad_score.replace(bad_score.find("\"sqrtsoftplus\""), 14, "\"softmax\"");
  EXPECT_NE(error(bad_score).find("unsupported scoring_func \"softmax\""), std::string::npos);
  std::string mscale = kCheckpointSpelling;
  mscale.replace(mscale.find("\"beta_slow\": 1}"), 15, "\"beta_slow\": 1, \"attention_factor\": 1.3}");
  EXPECT_NE(error(mscale).find("attention_factor"), std::string::npos);
}

}  // namespace
}  // namespace dsmesh

namespace dsmesh {
namespace {

// `dsmesh up` decides whether its cached demo model is current by comparing config.json with
// TinyModelConfig, so the two must agree for both spellings.
TEST(ConfigTest, TinyModelConfigIsWhatMakeTinyWrites) {
  for (bool hf : {false, true}) {
    TinyModelSpec spec = testing_util::SmallSpec();
    spec.transformers_naming = hf;
    const std::string dir = testing_util::TempDir(hf ? "tiny_config_hf" : "tiny_config_ds");
    WriteTinyModel(dir, 3, spec);
    std::ifstream in(dir + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(in), nlohmann::json(TinyModelConfig(spec))) << dir;
    spec.o_groups = 2;
    EXPECT_NE(nlohmann::json(TinyModelConfig(spec)), nlohmann::json::parse(std::ifstream(dir + "/config.json")));
  }
}

}  // namespace
}  // namespace dsmesh

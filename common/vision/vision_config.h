// VisionConfig: the vision_* keys of a DeepSeek-V4(-Flash-Vision) config.json, shared by the image
// preprocessing (common/vision/vision_preprocess.h) and the vision tower (model/vision_tower.h).
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

namespace dsmesh {

// The vision_* keys of a DeepSeek-V4 config.json, with the defaults of vLLM's DeepseekV4Config
// (vllm/transformers_utils/configs/deepseek_v4.py); vision_n_layers 0 means text only.
struct VisionConfig {
  int n_layers = 0;
  int dim = 1024;
  int n_heads = 16;
  int inter_dim = 2816;
  int patch_size = 14;
  double rope_theta = 10000.0;
  int downsample_ratio = 3;
  int max_n_token = 384;
  int64_t min_pixels = 147456;
  std::optional<double> max_wh_ratio = 8.0;  // null in config.json: no clamp
  // Not a config key: the reference's vision RMSNorm (vision.py DeepseekV4RMSNorm) always uses its default.
  double norm_eps = 1e-6;

  int head_dim() const { return dim / n_heads; }
  bool enabled() const { return n_layers > 0; }

  // Throws std::runtime_error naming the field for a wrong type or a value out of range (the message does not
  // name the file: common/model_card.h, which reads these keys for every process, prefixes it).
  static VisionConfig FromJson(const nlohmann::json& config);
};

}  // namespace dsmesh

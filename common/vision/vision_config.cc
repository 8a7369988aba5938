#include "common/vision/vision_config.h"

#include <stdexcept>
#include <string>
#include <type_traits>

namespace dsmesh {

VisionConfig VisionConfig::FromJson(const nlohmann::json& j) {
  VisionConfig c;
  auto get_int = [&](const char* key, auto* out, long long min) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    if (!it->is_number_integer() || it->get<long long>() < min)
      throw std::runtime_error(std::string("field \"") + key + "\" must be an integer >= " + std::to_string(min));
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(it->get<long long>());
  };
  get_int("vision_n_layers", &c.n_layers, 0);
  get_int("vision_dim", &c.dim, 1);
  get_int("vision_n_heads", &c.n_heads, 1);
  get_int("vision_inter_dim", &c.inter_dim, 1);
  get_int("vision_patch_size", &c.patch_size, 1);
  get_int("vision_downsample_ratio", &c.downsample_ratio, 1);
  get_int("vision_max_n_token", &c.max_n_token, 8);
  get_int("vision_min_pixels", &c.min_pixels, 0);
  if (auto it = j.find("vision_rope_theta"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0) throw std::runtime_error("field \"vision_rope_theta\" must be > 0");
    c.rope_theta = it->get<double>();
  }
  if (auto it = j.find("vision_max_wh_ratio"); it != j.end()) {
    if (it->is_null()) {
      c.max_wh_ratio = std::nullopt;
    } else if (!it->is_number() || it->get<double>() <= 0) {
      throw std::runtime_error("field \"vision_max_wh_ratio\" must be a number > 0 or null");
    } else {
      c.max_wh_ratio = it->get<double>();
    }
  }
  if (c.dim % c.n_heads != 0 || (c.dim / c.n_heads) % 4 != 0)
    throw std::runtime_error("vision_dim / vision_n_heads must be a multiple of 4 (2D rotary halves)");
  return c;
}

}  // namespace dsmesh

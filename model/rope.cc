#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace dsmesh {

std::vector<float> PlainInvFreq(double theta, int rope_dim) {
  std::vector<float> f(rope_dim / 2);
  for (int i = 0; i < rope_dim / 2; ++i) {
    float expo = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    f[i] = 1.0f / std::pow(static_cast<float>(theta), expo);
  }
  return f;
}

std::vector<float> YarnInvFreq(double theta, int rope_dim, const YarnScaling& y) {
  if (!y.enabled) return PlainInvFreq(theta, rope_dim);
  const int half = rope_dim / 2;
  // Dimension index at which a frequency completes `rotations` turns over the original context.
  auto correction_dim = [&](double rotations) {
    return (rope_dim * std::log(y.original_max_position / (rotations * 2 * M_PI))) / (2 * std::log(theta));
  };
  double low = std::floor(correction_dim(y.beta_fast));
  double high = std::ceil(correction_dim(y.beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(rope_dim - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  std::vector<float> f(half);
  for (int i = 0; i < half; ++i) {
    float pos_freq = std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(rope_dim));
    float extrapolation = 1.0f / pos_freq;
    float interpolation = 1.0f / (static_cast<float>(y.factor) * pos_freq);
    float ramp = static_cast<float>((i - low) / (high - low));
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    float extrapolation_factor = 1.0f - ramp;
    f[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return f;
}

std::vector<float> LayerInvFreq(const ModelConfig& c, int layer) {
  if (c.attention_kind(layer) == AttentionKind::kSliding) return PlainInvFreq(c.rope_theta, c.rope_dim);
  return YarnInvFreq(c.compress_rope_theta, c.rope_dim, c.compress_yarn);
}

}  // namespace dsmesh

// Rotary inverse frequencies for DeepSeek-V4's two rope tables: plain (sliding layers, rope_theta) and
// YaRN without mscale (compressed layers and their compressor/indexer, compress_rope_theta). Computed in
// fp32 the way transformers does, so angles match its tables bit for bit where libm agrees.
#pragma once

#include <vector>

#include "model/config.h"

namespace dsmesh {

// rope_dim/2 inverse frequencies.
std::vector<float> PlainInvFreq(double theta, int rope_dim);
std::vector<float> YarnInvFreq(double theta, int rope_dim, const YarnScaling& yarn);

// The table a layer's attention uses.
std::vector<float> LayerInvFreq(const ModelConfig& c, int layer);

}  // namespace dsmesh

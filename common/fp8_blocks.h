// FP8 (e4m3fn) weights with block scales, as DeepSeek's checkpoints store them (docs/model-v4.md section 3):
// `X.weight` F8_E4M3 [rows, cols] and a sibling scale (`X.scale` in the checkpoint naming, `X.weight_scale_inv`
// as transformers spells it) of shape [ceil(rows/br), ceil(cols/bc)] holding one multiplier per br x bc block:
// value = fp8 * scale. DeepSeek uses 128 x 128 blocks; `dsmesh quantize --bits embed=fp8` writes one scale
// per row ([rows, 1], a power of two, so the bf16 dequantization is exact). A 1-D scale [rows] is per row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/tensor.h"

namespace dsmesh {

// The block size a scale of `scale_shape` implies for a [rows, cols] weight; throws std::runtime_error
// naming `label` when the shape fits no block size.
struct Fp8BlockSize {
  int64_t rows = 0, cols = 0;
};
Fp8BlockSize Fp8BlockSizeOf(int64_t rows, int64_t cols, const std::vector<int64_t>& scale_shape, const std::string& label);

// weight (F8_E4M3 [rows, cols]) x scale (f32/bf16/f16) -> a new bf16 tensor [rows, cols]. `label` names the
// tensors in errors (dtype, rank, shape, non-finite scale).
Tensor DequantizeFp8ToBf16(const Tensor& weight, const Tensor& scale, const std::string& label);

// Row-wise fp8: scale[r] = the power of two that brings the row's largest magnitude into (224, 448].
struct Fp8RowQuantized {
  Tensor weight;  // F8_E4M3 [rows, cols]
  Tensor scale;   // F32 [rows, 1]
};
Fp8RowQuantized QuantizeFp8Rows(const float* w, int64_t rows, int64_t cols);

}  // namespace dsmesh

#include "common/fp8_blocks.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "common/half.h"

namespace dsmesh {

Fp8BlockSize Fp8BlockSizeOf(int64_t rows, int64_t cols, const std::vector<int64_t>& scale_shape, const std::string& label) {
  const int64_t sr = scale_shape.empty() ? 0 : scale_shape[0];
  const int64_t sc = scale_shape.size() == 1 ? 1 : scale_shape.size() == 2 ? scale_shape[1] : 0;
  if (sr > 0 && sc > 0) {
    const Fp8BlockSize b{(rows + sr - 1) / sr, (cols + sc - 1) / sc};
    if ((rows + b.rows - 1) / b.rows == sr && (cols + b.cols - 1) / b.cols == sc) return b;
  }
  std::string shape = "[";
  for (size_t i = 0; i < scale_shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(scale_shape[i]);
  throw std::runtime_error(label + ": the fp8 scale has shape " + shape + "], which is no block grid of a [" +
                           std::to_string(rows) + ", " + std::to_string(cols) +
                           "] weight (expected [ceil(rows/br), ceil(cols/bc)], e.g. [rows, 1] per row or "
                           "128 x 128 blocks)");
}

Tensor DequantizeFp8ToBf16(const Tensor& weight, const Tensor& scale, const std::string& label) {
  if (weight.dtype != DType::kF8E4M3 || weight.shape.size() != 2)
    throw std::runtime_error(label + ": expected an F8_E4M3 2-D weight, got " + DTypeName(weight.dtype) + " " +
                             weight.ShapeString());
  if (scale.dtype != DType::kF32 && scale.dtype != DType::kBF16 && scale.dtype != DType::kF16)
    throw std::runtime_error(label + ": the fp8 scale has dtype " + DTypeName(scale.dtype) + ", expected F32, BF16 or F16");
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  const Fp8BlockSize b = Fp8BlockSizeOf(rows, cols, scale.shape, label);
  const std::vector<float> s = ToFloatVector(scale);
  for (float v : s)
    if (!std::isfinite(v)) throw std::runtime_error(label + ": the fp8 scale holds a non-finite value");
  const int64_t sc = (cols + b.cols - 1) / b.cols;
  Tensor out = AllocateTensor(DType::kBF16, {rows, cols});
  const uint8_t* q = static_cast<const uint8_t*>(weight.data);
  uint16_t* o = static_cast<uint16_t*>(out.data);
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = s.data() + (r / b.rows) * sc;
    for (int64_t c = 0; c < cols; ++c)
      o[r * cols + c] = FloatToBf16(Fp8E4M3ToFloat(q[r * cols + c]) * srow[c / b.cols]);
  }
  return out;
}

Fp8RowQuantized QuantizeFp8Rows(const float* w, int64_t rows, int64_t cols) {
  Fp8RowQuantized out;
  out.weight = AllocateTensor(DType::kF8E4M3, {rows, cols});
  out.scale = AllocateTensor(DType::kF32, {rows, 1});
  uint8_t* q = static_cast<uint8_t*>(out.weight.data);
  float* s = out.scale.as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
    // The smallest power of two with amax / scale <= 448 (all-zero rows: 1).
    const float scale = amax > 0 ? std::ldexp(1.0f, static_cast<int>(std::ceil(std::log2(amax / 448.0f)))) : 1.0f;
    s[r] = scale;
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = FloatToFp8E4M3(row[c] / scale);
  }
  return out;
}

}  // namespace dsmesh

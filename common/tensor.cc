#include "common/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/half.h"

namespace dsmesh {
namespace {

template <class T>
void Widen(const Tensor& tensor, std::vector<float>& out) {
  const T* src = static_cast<const T*>(tensor.data);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(src[i]);
}

}  // namespace

int64_t Tensor::numel() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::string Tensor::ShapeString() const {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::vector<float> ToFloatVector(const Tensor& tensor) {
  std::vector<float> out(static_cast<size_t>(tensor.numel()));
  if (out.empty()) return out;
  if (tensor.data == nullptr) throw std::runtime_error("ToFloatVector: tensor has no data");
  switch (tensor.dtype) {
    case DType::kBool: {
      const uint8_t* src = static_cast<const uint8_t*>(tensor.data);
      for (size_t i = 0; i < out.size(); ++i) out[i] = src[i] ? 1.0f : 0.0f;
      break;
    }
    case DType::kU8: Widen<uint8_t>(tensor, out); break;
    case DType::kI8: Widen<int8_t>(tensor, out); break;
    case DType::kI16: Widen<int16_t>(tensor, out); break;
    case DType::kI32: Widen<int32_t>(tensor, out); break;
    case DType::kI64: Widen<int64_t>(tensor, out); break;
    case DType::kF32: std::memcpy(out.data(), tensor.data, out.size() * sizeof(float)); break;
    case DType::kF64: Widen<double>(tensor, out); break;
    case DType::kF8E4M3: {
      const uint8_t* src = static_cast<const uint8_t*>(tensor.data);
      for (size_t i = 0; i < out.size(); ++i) out[i] = Fp8E4M3ToFloat(src[i]);
      break;
    }
    case DType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(tensor.data);
      for (size_t i = 0; i < out.size(); ++i) out[i] = Fp16ToFloat(src[i]);
      break;
    }
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(tensor.data);
      for (size_t i = 0; i < out.size(); ++i) out[i] = Bf16ToFloat(src[i]);
      break;
    }
  }
  return out;
}

Tensor AllocateTensor(DType dtype, std::vector<int64_t> shape) {
  Tensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  for (int64_t dim : tensor.shape) {
    if (dim < 0) throw std::runtime_error("AllocateTensor: negative dimension in " + tensor.ShapeString());
  }
  // 64-byte aligned so vectorized loops and later device copies see aligned rows.
  size_t bytes = (std::max<size_t>(tensor.nbytes(), 1) + 63) / 64 * 64;
  void* buffer = std::aligned_alloc(64, bytes);
  if (buffer == nullptr) throw std::runtime_error("AllocateTensor: out of memory for " + tensor.ShapeString());
  std::memset(buffer, 0, bytes);
  tensor.data = buffer;
  tensor.owner = std::shared_ptr<void>(buffer, std::free);
  return tensor;
}

}  // namespace dsmesh

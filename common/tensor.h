// A plain tensor: dtype, shape and a pointer to row-major data, kept alive by `owner`.
// Views into a memory-mapped file share ownership of the mapping, so the file stays mapped
// as long as any view of it exists.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace dsmesh {

struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  void* data = nullptr;
  std::shared_ptr<void> owner;

  int64_t numel() const;  // product of shape; 1 for a scalar (empty shape)
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }

  // Typed access; T must have the element size of dtype (e.g. uint16_t for BF16), else throws.
  template <class T>
  T* as() const {
    if (sizeof(T) != DTypeSize(dtype)) {
      throw std::runtime_error(std::string("Tensor::as: element size ") + std::to_string(sizeof(T)) +
                               " does not match dtype " + DTypeName(dtype));
    }
    return static_cast<T*>(data);
  }

  std::string ShapeString() const;  // "[4, 128]"
};

// A new fp32 copy of any tensor (float, integer or bool dtypes).
std::vector<float> ToFloatVector(const Tensor& tensor);

// A tensor that owns a fresh zero-filled buffer.
Tensor AllocateTensor(DType dtype, std::vector<int64_t> shape);

}  // namespace dsmesh

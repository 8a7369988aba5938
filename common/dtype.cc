#include "common/dtype.h"

#include <stdexcept>

namespace dsmesh {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kBool, "BOOL", 1}, {DType::kU8, "U8", 1},           {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},   {DType::kI32, "I32", 4},         {DType::kI64, "I64", 8},
    {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF16, "F16", 2},    {DType::kBF16, "BF16", 2},
    {DType::kF32, "F32", 4},   {DType::kF64, "F64", 8},
};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  throw std::runtime_error("invalid DType value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

const char* DTypeName(DType dtype) { return Info(dtype).name; }

DType DTypeFromName(const std::string& safetensors_name) {
  for (const DTypeInfo& info : kDTypes) {
    if (safetensors_name == info.name) return info.dtype;
  }
  throw std::runtime_error("unknown or unsupported dtype '" + safetensors_name +
                           "' (supported: BOOL U8 I8 I16 I32 I64 F8_E4M3 F16 BF16 F32 F64)");
}

}  // namespace dsmesh

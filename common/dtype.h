// Element types of tensors in model files, named as the safetensors format spells them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsmesh {

// Every dtype a DeepSeek or EXL3 checkpoint uses. kF8E4M3 is the "fn" variant (no infinities, 0x7f/0xff NaN).
enum class DType : uint8_t { kBool, kU8, kI8, kI16, kI32, kI64, kF8E4M3, kF16, kBF16, kF32, kF64 };

size_t DTypeSize(DType dtype);       // bytes per element
const char* DTypeName(DType dtype);  // "BF16", "F8_E4M3", ... exactly as in a safetensors header

// Inverse of DTypeName; throws std::runtime_error naming the unknown dtype.
DType DTypeFromName(const std::string& safetensors_name);

}  // namespace dsmesh

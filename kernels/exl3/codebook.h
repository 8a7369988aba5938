// EXL3 codebooks: a 16-bit trellis state -> one fp16 weight (docs/exl3-format.md §2.5).
//
// Three codebooks exist. 3INST (no marker tensor) and MCG (`.mcg` marker) multiply the state by a
// constant, mask/xor the product into two fp16 halves and add them; MUL1 (`.mul1` marker) sums the
// product's bytes and maps the sum affinely. All three are bit-exact against exllamav3 1.4.1
// (tested against kernels/exl3/testdata/exl3_codebooks.safetensors).
//
// This header is deliberately small: the CUDA kernels use these functions as their reference.
#pragma once

#include <cstdint>
#include <string>

namespace dsmesh {

enum class Exl3Codebook { k3Inst, kMcg, kMul1 };

// "3inst", "mcg", "mul1" (the spelling of the test vectors and of quantization_config.codebook).
const char* Exl3CodebookName(Exl3Codebook cb);
// Inverse of Exl3CodebookName; throws std::runtime_error naming `what` on an unknown spelling.
Exl3Codebook ParseExl3Codebook(const std::string& name, const std::string& what = "codebook");

// Multipliers that the marker tensors must hold (as int32 bit patterns).
constexpr uint32_t kExl3McgMultiplier = 0xCBAC1FEDu;
constexpr uint32_t kExl3Mul1Multiplier = 0x83DCD12Du;
// Standard deviation of the 3INST/MCG codebooks over all states (quantize.py `codebook_scale`).
constexpr double kExl3CodebookScale = 1.24371088;

// Scalar reference: the fp16 bit pattern of codebook(state). Exact, no tables.
uint16_t Exl3CodebookFp16(Exl3Codebook cb, uint16_t state);

// 65536-entry tables built once from Exl3CodebookFp16 (thread-safe lazy init).
const uint16_t* Exl3CodebookTableFp16(Exl3Codebook cb);
const float* Exl3CodebookTableF32(Exl3Codebook cb);

}  // namespace dsmesh

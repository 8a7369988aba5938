#include "common/half.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace dsmesh {
namespace {

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Shifts `value` right by `shift` bits (shift >= 1) rounding to nearest, ties to even.
uint32_t ShiftRightRne(uint32_t value, int shift) {
  if (shift >= 32) return 0;
  uint32_t kept = value >> shift;
  uint32_t rest = value & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1))) ++kept;
  return kept;
}

}  // namespace

float Bf16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBf16(float value) {
  uint32_t bits = FloatBits(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // keep sign, force quiet
  // Carries out of the mantissa propagate into the exponent, so overflow becomes inf as it should.
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float Fp16ToFloat(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return BitsFloat(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

uint16_t FloatToFp16(float value) {
  uint32_t bits = FloatBits(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  int exponent = static_cast<int>((bits >> 23) & 0xff);
  uint32_t mantissa = bits & 0x7fffff;
  if (exponent == 0xff) return sign | (mantissa ? 0x7e00 : 0x7c00);
  int half_exponent = exponent - 127 + 15;
  if (half_exponent >= 31) return sign | 0x7c00;
  if (half_exponent <= 0) {
    // Subnormal half: count units of 2^-24. The fp32 value is (2^23 | m) * 2^(exponent - 150).
    if (exponent == 0) return sign;  // fp32 subnormals are far below half's smallest subnormal
    uint32_t significand = mantissa | 0x800000u;
    return sign | static_cast<uint16_t>(ShiftRightRne(significand, 126 - exponent));
  }
  uint32_t rounded = ShiftRightRne((static_cast<uint32_t>(half_exponent) << 23) | mantissa, 13);
  if (rounded >= 0x7c00) return sign | 0x7c00;  // rounding carried into the inf exponent
  return sign | static_cast<uint16_t>(rounded);
}

float Fp8E4M3ToFloat(uint8_t bits) {
  bool negative = bits & 0x80;
  int exponent = (bits >> 3) & 0xf;
  int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // 2^(1-7) * mantissa/8
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 7 - 3);
  }
  return negative ? -magnitude : magnitude;
}

uint8_t FloatToFp8E4M3(float value) {
  uint32_t bits = FloatBits(value);
  uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  if (!std::isfinite(value)) return sign | 0x7f;
  int exponent = static_cast<int>((bits >> 23) & 0xff);
  uint32_t mantissa = bits & 0x7fffff;
  int e4_exponent = exponent - 127 + 7;
  uint32_t rounded;
  if (e4_exponent <= 0) {
    // Subnormal e4m3: units of 2^-9. The fp32 value is (2^23 | m) * 2^(exponent - 150).
    if (exponent == 0) return sign;
    rounded = ShiftRightRne(mantissa | 0x800000u, 141 - exponent);
  } else if (e4_exponent > 15) {
    return sign | 0x7f;
  } else {
    rounded = ShiftRightRne((static_cast<uint32_t>(e4_exponent) << 23) | mantissa, 20);
  }
  if (rounded > 0x7e) return sign | 0x7f;  // beyond 448 after rounding: NaN (no inf in e4m3fn)
  return sign | static_cast<uint8_t>(rounded);
}

}  // namespace dsmesh

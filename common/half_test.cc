// Bit-exact checks of the narrow float conversions against known encodings and exhaustive round trips.
#include "common/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace dsmesh {
namespace {

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

TEST(Bf16, KnownPatterns) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0x4049), 3.140625f);
  // Ties go to the even neighbour; anything above the tie goes up.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000)), 0x3f80);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000)), 0x3f82);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f807fff)), 0x3f80);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7fffff)), 0x7f80);  // largest float rounds to inf
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(FloatToBf16(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0x7f800001)))));  // NaN payload below bf16 bits stays NaN
}

TEST(Bf16, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float value = Bf16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToBf16(value), bits) << std::hex << bits;
  }
}

TEST(Fp16, KnownPatterns) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFp16(0.1f), 0x2e66);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);   // largest finite
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7bff);   // below the tie
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);   // tie with "65536" rounds to even = inf
  EXPECT_EQ(FloatToFp16(1e10f), 0x7c00);
  EXPECT_EQ(FloatToFp16(-INFINITY), 0xfc00);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 1 unit -> 0 (even)
  EXPECT_EQ(FloatToFp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToFp16(std::ldexp(3.0f, -25)), 0x0002);  // tie between 1 and 2 units -> 2
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToFp16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isinf(Fp16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(Fp16ToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(NAN))));
}

TEST(Fp16, EveryPatternRoundTripsAndMidpointsRoundToEven) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float value = Fp16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToFp16(value), bits) << std::hex << bits;
    // Midpoint to the next larger magnitude (exact in fp32): must go to whichever code is even.
    uint32_t magnitude = bits & 0x7fff;
    if (magnitude >= 0x7bff) continue;
    float next = Fp16ToFloat(static_cast<uint16_t>(bits + 1));
    float midpoint = (value + next) / 2;
    uint32_t even = (bits & 1) ? bits + 1 : bits;
    ASSERT_EQ(FloatToFp16(midpoint), even) << std::hex << bits;
    ASSERT_EQ(FloatToFp16(std::nextafter(midpoint, value)), bits) << std::hex << bits;
    ASSERT_EQ(FloatToFp16(std::nextafter(midpoint, next)), bits + 1) << std::hex << bits;
  }
}

TEST(Fp8E4M3, KnownPatterns) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0xb8), -1.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);  // largest finite: no infinities in e4m3fn
  EXPECT_EQ(Fp8E4M3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x78), 256.0f);  // exponent 15 with mantissa < 7 is an ordinary number
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4M3ToFloat(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(Fp8E4M3ToFloat(0x80)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xff)));
  EXPECT_EQ(Fp8E4M3ToFloat(0x46), 3.5f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x4c), 6.0f);
  EXPECT_EQ(FloatToFp8E4M3(464.0f), 0x7e);  // tie between 448 and the NaN code -> even (448)
  EXPECT_EQ(FloatToFp8E4M3(470.0f), 0x7f);  // beyond: NaN, never inf
  EXPECT_EQ(FloatToFp8E4M3(-1e6f), 0xff);
  EXPECT_EQ(FloatToFp8E4M3(INFINITY), 0x7f);
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie -> 0
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 units: tie -> 2
  EXPECT_EQ(FloatToFp8E4M3(1.0625f), 0x38);                // tie between 1.0 and 1.125 -> 1.0 (even)
  EXPECT_EQ(FloatToFp8E4M3(1.1875f), 0x3a);                // tie between 1.125 and 1.25 -> 1.25 (even)
}

TEST(Fp8E4M3, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits < 0x100; ++bits) {
    float value = Fp8E4M3ToFloat(static_cast<uint8_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToFp8E4M3(value), bits) << std::hex << bits;
  }
}

}  // namespace
}  // namespace dsmesh

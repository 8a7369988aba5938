// Bit-exact conversions between fp32 and the narrow float formats stored in checkpoints.
// Narrowing conversions round to nearest, ties to even, like torch's .to(dtype).
#pragma once

#include <cstdint>

namespace dsmesh {

float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);  // NaN stays NaN (quiet), overflow rounds to +-inf

float Fp16ToFloat(uint16_t bits);
uint16_t FloatToFp16(float value);  // IEEE binary16; overflow -> +-inf, tiny values -> subnormals / +-0

// float8 e4m3fn: bias 7, no infinities, S.1111.111 is NaN, largest finite is 448.
float Fp8E4M3ToFloat(uint8_t bits);
// Values whose rounded magnitude exceeds 448 (and inf, NaN) become NaN, as in torch's cast.
uint8_t FloatToFp8E4M3(float value);

}  // namespace dsmesh

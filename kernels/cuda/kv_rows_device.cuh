// Device twins of kernels/kv_rows.cc: bf16 and fp8 e4m3 element codecs with the same rounding as
// common/half.cc (round to nearest even; fp8 overflow and non-finite values become NaN, as torch's cast),
// and the reads of one stored row (PagedRowsDev::kind) that the attention and indexer kernels use.
#pragma once

#include <cstdint>

#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/model_ops_device.cuh"

namespace dsmesh::cuda_ops {

__device__ __forceinline__ float Bf16BitsToFloat(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

__device__ __forceinline__ uint16_t FloatToBf16Bits(float v) {
  const uint32_t bits = __float_as_uint(v);
  if (isnan(v)) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float Fp8E4M3BitsToFloat(uint8_t b) {
  const int exponent = (b >> 3) & 0xf, mantissa = b & 0x7;
  float m;
  if (exponent == 0xf && mantissa == 0x7) m = __int_as_float(0x7fc00000);
  else if (exponent == 0) m = ldexpf(static_cast<float>(mantissa), -9);
  else m = ldexpf(static_cast<float>(8 + mantissa), exponent - 10);
  return (b & 0x80) ? -m : m;
}

__device__ __forceinline__ uint32_t ShiftRightRneDev(uint32_t value, int shift) {
  if (shift >= 32) return 0;
  uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1))) ++kept;
  return kept;
}

__device__ __forceinline__ uint8_t FloatToFp8E4M3Bits(float v) {
  const uint32_t bits = __float_as_uint(v);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  if (!isfinite(v)) return sign | 0x7f;
  const int exponent = static_cast<int>((bits >> 23) & 0xff), e4 = exponent - 127 + 7;
  const uint32_t mantissa = bits & 0x7fffff;
  uint32_t rounded;
  if (e4 <= 0) {
    if (exponent == 0) return sign;
    rounded = ShiftRightRneDev(mantissa | 0x800000u, 141 - exponent);
  } else if (e4 > 15) {
    return sign | 0x7f;
  } else {
    rounded = ShiftRightRneDev((static_cast<uint32_t>(e4) << 23) | mantissa, 20);
  }
  if (rounded > 0x7e) return sign | 0x7f;
  return sign | static_cast<uint8_t>(rounded);
}

// The f32 scale of an fp8 row (stored unaligned after the nope bytes).
__device__ __forceinline__ float Fp8RowScale(const uint8_t* row, int nope) {
  const uint32_t b = static_cast<uint32_t>(row[nope]) | (static_cast<uint32_t>(row[nope + 1]) << 8) |
                     (static_cast<uint32_t>(row[nope + 2]) << 16) | (static_cast<uint32_t>(row[nope + 3]) << 24);
  return __uint_as_float(b);
}

// Value c of a stored row; `scale` is Fp8RowScale's for fp8 rows (ignored otherwise).
__device__ __forceinline__ float StoredRowValue(const void* row, RowKind kind, int nope, float scale, int c) {
  if (kind == RowKind::kF32) return static_cast<const float*>(row)[c];
  const uint8_t* b = static_cast<const uint8_t*>(row);
  if (kind == RowKind::kBF16) return Bf16BitsToFloat(static_cast<uint16_t>(b[2 * c] | (b[2 * c + 1] << 8)));
  if (c < nope) return Fp8E4M3BitsToFloat(b[c]) * scale;
  const uint8_t* r = b + nope + 4 + 2 * (c - nope);
  return Bf16BitsToFloat(static_cast<uint16_t>(r[0] | (r[1] << 8)));
}

// One warp writes a stored row of `dd` values as f32 into shared memory (a null row as zeros). f32 rows go
// as float4 loads when `vec4` (dd % 4 == 0 and the row 16-byte aligned).
__device__ __forceinline__ void WarpCopyRow(const float* row, int dd, bool vec4, int lane, float* dst) {
  if (vec4) {
#pragma unroll 4
    for (int c4 = lane; c4 < dd / 4; c4 += 32) {
      const float4 v = row ? __ldg(reinterpret_cast<const float4*>(row) + c4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      dst[4 * c4] = v.x;
      dst[4 * c4 + 1] = v.y;
      dst[4 * c4 + 2] = v.z;
      dst[4 * c4 + 3] = v.w;
    }
  } else {
    for (int c = lane; c < dd; c += 32) dst[c] = row ? row[c] : 0.0f;
  }
}

__device__ __forceinline__ void WarpCopyStoredRow(const void* row, RowKind kind, int nope, int dd, bool vec4, int lane,
                                                  float* dst) {
  if (kind == RowKind::kF32 || !row) {
    WarpCopyRow(static_cast<const float*>(row), dd, vec4, lane, dst);
    return;
  }
  const float scale = kind == RowKind::kFp8 ? Fp8RowScale(static_cast<const uint8_t*>(row), nope) : 0.0f;
  for (int c = lane; c < dd; c += 32) dst[c] = StoredRowValue(row, kind, nope, scale, c);
}

// The whole block writes one f32 row x of `dim` values as a stored row of `kind` at out (kernels/kv_rows.h):
// f32 as it is, bf16 values, or the fp8 layout (the first `nope` values e4m3 over the block's largest
// |value| / 448, that scale as 4 bytes, then dim - nope bf16 values). The max is exact whatever the order,
// so the bytes equal the CPU encoder's. Every thread of the block must call it.
__device__ __forceinline__ void BlockEncodeKvRow(const float* x, int64_t dim, int64_t nope, RowKind kind,
                                                 uint8_t* out) {
  if (kind == RowKind::kF32) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) reinterpret_cast<float*>(out)[i] = x[i];
    return;
  }
  if (kind == RowKind::kBF16) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const uint16_t b = FloatToBf16Bits(x[i]);
      out[2 * i] = static_cast<uint8_t>(b & 0xff);
      out[2 * i + 1] = static_cast<uint8_t>(b >> 8);
    }
    return;
  }
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < nope; i += blockDim.x) amax = fmaxf(amax, fabsf(x[i]));
  amax = BlockReduce<true>(amax);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  for (int64_t i = threadIdx.x; i < nope; i += blockDim.x) out[i] = FloatToFp8E4M3Bits(x[i] / scale);
  if (threadIdx.x < 4) out[nope + threadIdx.x] = static_cast<uint8_t>(__float_as_uint(scale) >> (8 * threadIdx.x));
  for (int64_t i = threadIdx.x; i < dim - nope; i += blockDim.x) {
    const uint16_t b = FloatToBf16Bits(x[nope + i]);
    out[nope + 4 + 2 * i] = static_cast<uint8_t>(b & 0xff);
    out[nope + 4 + 2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
}

}  // namespace dsmesh::cuda_ops

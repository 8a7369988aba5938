#include "kernels/exl3/codebook.h"

#include <immintrin.h>

#include <array>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace dsmesh {
namespace {

// IEEE binary16 round-to-nearest-even of a float via F16C (exact single rounding).
uint16_t RoundToFp16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
float Fp16Bits(uint16_t h) { return _cvtsh_ss(h); }

// 3INST/MCG tail: lop3 (x & 0x8FFF8FFF) ^ 0x3B603B60, then fp16(lo) + fp16(hi) rounded once.
// Both halves have exponents 12..15, so their float sum is exact and the F16C rounding is the
// only rounding, as with __hadd on the GPU.
uint16_t SumOfHalves(uint32_t x) {
  x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  float lo = Fp16Bits(static_cast<uint16_t>(x & 0xFFFF));
  float hi = Fp16Bits(static_cast<uint16_t>(x >> 16));
  return RoundToFp16(lo + hi);
}

}  // namespace

const char* Exl3CodebookName(Exl3Codebook cb) {
  switch (cb) {
    case Exl3Codebook::k3Inst: return "3inst";
    case Exl3Codebook::kMcg: return "mcg";
    case Exl3Codebook::kMul1: return "mul1";
  }
  return "?";
}

Exl3Codebook ParseExl3Codebook(const std::string& name, const std::string& what) {
  if (name == "3inst") return Exl3Codebook::k3Inst;
  if (name == "mcg") return Exl3Codebook::kMcg;
  if (name == "mul1") return Exl3Codebook::kMul1;
  throw std::runtime_error(what + ": unknown EXL3 codebook '" + name + "' (expected 3inst, mcg or mul1)");
}

uint16_t Exl3CodebookFp16(Exl3Codebook cb, uint16_t state) {
  const uint32_t s = state;
  switch (cb) {
    case Exl3Codebook::k3Inst:
      return SumOfHalves(s * 89226354u + 64248484u);
    case Exl3Codebook::kMcg:
      return SumOfHalves(s * kExl3McgMultiplier);
    case Exl3Codebook::kMul1: {
      const uint32_t x = s * kExl3Mul1Multiplier;
      const uint32_t b = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24);
      // fp16(0x6400 + b) == 1024 + b exactly; one fused rounding of h * k_inv + k_bias.
      // (1024 + b) * k_inv + k_bias is a multiple of 2^-18 below 2^4, exact in float.
      const float k_inv = Fp16Bits(0x1EEE), k_bias = Fp16Bits(0xC931);
      return RoundToFp16(std::fma(static_cast<float>(1024 + b), k_inv, k_bias));
    }
  }
  throw std::logic_error("Exl3CodebookFp16: bad codebook enum");
}

namespace {
struct Tables {
  std::vector<uint16_t> fp16;
  std::vector<float> f32;
};
const Tables& TablesFor(Exl3Codebook cb) {
  static std::array<Tables, 3> tables;
  static std::once_flag once;
  std::call_once(once, [] {
    for (int c = 0; c < 3; ++c) {
      Tables& t = tables[c];
      t.fp16.resize(65536);
      t.f32.resize(65536);
      for (uint32_t s = 0; s < 65536; ++s) {
        t.fp16[s] = Exl3CodebookFp16(static_cast<Exl3Codebook>(c), static_cast<uint16_t>(s));
        t.f32[s] = Fp16Bits(t.fp16[s]);
      }
    }
  });
  return tables[static_cast<int>(cb)];
}
}  // namespace

const uint16_t* Exl3CodebookTableFp16(Exl3Codebook cb) { return TablesFor(cb).fp16.data(); }
const float* Exl3CodebookTableF32(Exl3Codebook cb) { return TablesFor(cb).f32.data(); }

}  // namespace dsmesh

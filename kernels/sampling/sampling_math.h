// The arithmetic of a sampled draw, shared bit for bit by the host sampler (row_sampler.cc,
// worker/sampler.cc) and the CUDA sampling kernels (kernels/cuda/sampling_ops.cu), so that both pick the
// same token for the same logits, seed and position, whatever order they add in.
//
// Why integers: a draw walks the kept tokens in order and compares a cumulative mass with u * total. In
// floating point that mass depends on the order of the additions (a GPU reduces in a tree, the host in a
// line), so near a boundary the two could pick different tokens. Here every token's unnormalized
// probability exp(x - max) is turned into an integer weight W = floor(2^S * exp(x - max)) by an exp
// written out of IEEE operations and explicit fma (no library exp, whose last bit differs between glibc
// and CUDA). Sums of weights are exact integers below 2^53 (S = 53 - bit_width(vocab)), so every cut
// (min_p, top_k, top_p) and the draw come out the same on both sides in any summation order.
// The cost: a token whose probability is below 2^-S of the most likely one (2^-36 ~ 1.5e-11 at vocab
// 129280) gets weight 0 and is never drawn, and weights are exact to 2^-S relative to the top token.
//
// Host callers must compile without floating-point contraction (-ffp-contract=off): every multiply-add
// here is an explicit fma, and a compiler that fused another product into an add would change bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/sampling/random_stream.h"  // DSMESH_HOST_DEVICE

namespace dsmesh::sampling {

// Temperatures below this are greedy (the argmax of the logits).
constexpr float kGreedyTemperature = 1e-5f;
// Most top logprobs a row may ask for (SamplingParams.logprobs is validated to [0, 20]).
constexpr int kMaxTopLogprobs = 20;

// S such that vocab * 2^S <= 2^53: every sum of weights is an exact double and an exact uint64.
DSMESH_HOST_DEVICE inline int WeightShift(int64_t vocab) {
  int bits = 0;
  for (uint64_t v = static_cast<uint64_t>(vocab); v; v >>= 1) ++bits;
  return 53 - bits;
}

// floor(2^shift * exp(d)) for d <= 0 (d = x - max, so the top token weighs exactly 2^shift); 0 for
// -inf, NaN and every d whose weight is below 1. Cody-Waite reduction d = k ln2 + t, |t| <= ln2/2, and
// exp(t) by its Taylor series to t^12 (truncation ~1.7e-16): only IEEE-exact operations, identical on
// the host and the device. Monotone in d for the float-valued d the sampler feeds it (consecutive floats
// differ by far more than the polynomial's last-bit error).
DSMESH_HOST_DEVICE inline uint64_t SampleWeight(double d, int shift) {
  if (!(d <= 0.0)) return d > 0.0 ? (uint64_t{1} << shift) : 0;  // NaN: 0; d > 0 cannot happen (max)
  if (d < -1000.0) return 0;                                      // also -inf
  constexpr double kLog2e = 0x1.71547652b82fep+0;
  constexpr double kLn2Hi = 0x1.62e42fefa39efp-1;   // ln 2 rounded to double
  constexpr double kLn2Lo = 0x1.abc9e3b39803fp-56;  // ln 2 - kLn2Hi
  const double k = rint(d * kLog2e);
  const int e = static_cast<int>(k) + shift;
  if (e < -1) return 0;  // exp(t) < 1.42, so the weight is below 0.71
  double t = fma(-k, kLn2Hi, d);
  t = fma(-k, kLn2Lo, t);
  double p = 0x1.1eed8eff8d898p-29;  // 1/12!
  p = fma(p, t, 0x1.ae64567f544e4p-26);  // 1/11!
  p = fma(p, t, 0x1.27e4fb7789f5cp-22);  // 1/10!
  p = fma(p, t, 0x1.71de3a556c734p-19);  // 1/9!
  p = fma(p, t, 0x1.a01a01a01a01ap-16);  // 1/8!
  p = fma(p, t, 0x1.a01a01a01a01ap-13);  // 1/7!
  p = fma(p, t, 0x1.6c16c16c16c17p-10);  // 1/6!
  p = fma(p, t, 0x1.1111111111111p-7);   // 1/5!
  p = fma(p, t, 0x1.5555555555555p-5);   // 1/4!
  p = fma(p, t, 0x1.5555555555555p-3);   // 1/3!
  p = fma(p, t, 0x1.0000000000000p-1);   // 1/2!
  p = fma(p, t, 1.0);
  p = fma(p, t, 1.0);
  return static_cast<uint64_t>(floor(ldexp(p, e)));
}

// The temperature-scaled logit of the sampler: an IEEE float division (as the host's `x / temperature`),
// NaN read as -inf so that it is never drawn.
DSMESH_HOST_DEVICE inline float ScaledLogit(float raw, float temperature) {
#if defined(__CUDA_ARCH__)
  const float x = __fdiv_rn(raw, temperature);
#else
  const float x = raw / temperature;
#endif
  return x != x ? -INFINITY : x;
}

// A float's rank as an unsigned integer (larger float, larger key; -0 and +0 the same key): the sampler
// orders tokens by key, larger first, lower id first among equal keys.
DSMESH_HOST_DEVICE inline uint32_t OrderKey(float x) {
  uint32_t b;
#if defined(__CUDA_ARCH__)
  b = __float_as_uint(x);
#else
  std::memcpy(&b, &x, sizeof(b));
#endif
  if (b == 0x80000000u) b = 0;  // -0 == +0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The weight a token needs to survive min_p: W >= min_p * W(top) = min_p * 2^shift (0: no cut).
DSMESH_HOST_DEVICE inline uint64_t MinPWeight(float min_p, int shift) {
  if (!(min_p > 0.0f)) return 0;
  return static_cast<uint64_t>(ceil(ldexp(static_cast<double>(min_p), shift)));
}

// top_p keeps the shortest prefix whose cumulative weight reaches this (a fraction of the whole
// vocabulary's weight, as the probabilities were normalized over it).
DSMESH_HOST_DEVICE inline uint64_t TopPWeight(float top_p, uint64_t total) {
  return static_cast<uint64_t>(ceil(static_cast<double>(top_p) * static_cast<double>(total)));
}

// The draw: the first kept token whose cumulative weight exceeds this (u in [0, 1), kept > 0). u * kept
// may round up to kept; the last token of positive weight is then drawn.
DSMESH_HOST_DEVICE inline uint64_t DrawTarget(double u, uint64_t kept) {
  const uint64_t t = static_cast<uint64_t>(floor(u * static_cast<double>(kept)));
  return t < kept ? t : kept - 1;
}

}  // namespace dsmesh::sampling

// The EXL3 encoder's core: a tail-biting Viterbi search over the 16-bit trellis for one 16x16 tile
// (docs/exl3-format.md §5.2), for any K in 1..8 and all three codebooks.
//
// The search runs over "edges", the low 16-K bits of a state (2^(16-K) of them). At position t the
// cost of edge e is min over the high K bits kappa of state s = kappa << (16-K) | e of
//   cost_{t-1}[s >> K] + (codebook(s) - target_t)^2,
// ties going to the smallest kappa. Costs are fp32 (exllamav3 uses fp16). Tail-biting takes two passes:
// pass 1 runs unconstrained from position 128 around to 127 and reads off the edge that state 255 must
// end in; pass 2 runs 0..255 with state 0's predecessor forced to that edge. The resulting states obey
// Exl3StatesTailBiting, so packing them (Exl3PackTileStates) and unpacking gives them back exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/exl3/codebook.h"

namespace dsmesh {

class Exl3TileEncoder {
 public:
  // Scratch is 256 * 2^(16-K) bytes of back-pointers (8 MB at K=1) plus two cost rows; one encoder
  // per thread. The search uses AVX-512 when the CPU has it and allow_avx512 is set (the build targets
  // x86-64-v3, so that path is compiled separately and picked at run time); both paths give identical
  // states.
  Exl3TileEncoder(int K, Exl3Codebook codebook, bool allow_avx512 = true);
  ~Exl3TileEncoder();
  Exl3TileEncoder(const Exl3TileEncoder&) = delete;
  Exl3TileEncoder& operator=(const Exl3TileEncoder&) = delete;

  // targets: 256 values in sequence order (position t sits at tile cell Exl3TileRow/Col(t)).
  // Writes the 256 states and returns the sum of squared errors of the decoded values.
  double Encode(const float targets[256], uint16_t states[256]);

  int K() const { return K_; }
  bool uses_avx512() const { return avx512_; }
  Exl3Codebook codebook() const { return codebook_; }

 private:
  // One trellis step: cur[e] from prev, back-pointers into bp (2^(16-K) bytes).
  void Step(float target, const float* prev, float* cur, uint8_t* bp) const;
  // Traces back from `edge` at step `last` down to step `first`; writes states of those steps.
  void Trace(int first, int last, uint32_t edge, uint16_t* states_by_step) const;

  int K_;
  Exl3Codebook codebook_;
  uint32_t edges_;
  bool avx512_;
  const float* table_;  // codebook values as fp32
  float* cost_[2];
  uint8_t* bp_;  // [256][edges_]
};

// Whether this CPU can run the AVX-512 search.
bool Exl3EncoderCanUseAvx512();

}  // namespace dsmesh

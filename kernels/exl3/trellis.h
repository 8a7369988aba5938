// EXL3 trellis tiles: the packed bitstream of one 16x16 tile <-> 256 16-bit states <-> 256 weights
// (docs/exl3-format.md §2.1-2.4, §2.7). Scalar reference code, small on purpose: the CUDA kernels and the
// fast CPU paths are tested against it.
//
// A tile is 16K int16 words (K = bits per weight, 1..8). Read as little-endian 32-bit words, the
// bitstream is MSB-first inside each word; position t (0..255) owns stream bits [tK, tK+K). The state
// of position t is the 16-bit window of stream bits ending at (t+1)K, wrapping around the tile's own
// stream (tail-biting). Position t sits at tile row/column Exl3TileRow(t)/Exl3TileCol(t), the
// mma.m16n8k16 B-operand order.
#pragma once

#include <cstdint>

#include "kernels/exl3/codebook.h"

namespace dsmesh {

constexpr int kExl3TileSize = 16;  // tiles are 16 x 16 weights
constexpr int kExl3MinK = 1, kExl3MaxK = 8;

// Tile row (input dimension) and column (output dimension) of sequence position t (§2.4).
constexpr int Exl3TileRow(int t) {
  const int q = t / 8, e = t % 8;
  return 2 * (q % 4) + (e % 2) + 8 * ((e / 2) % 2);
}
constexpr int Exl3TileCol(int t) {
  const int q = t / 8, e = t % 8;
  return q / 4 + 8 * (e / 4);
}

// Number of int16 words of one tile at K bits.
constexpr int Exl3TileWords(int K) { return 16 * K; }

// Packed tile (16K words) -> the 256 states in sequence order (exllamav3 `unpack_trellis`).
void Exl3UnpackTileStates(const uint16_t* tile, int K, uint16_t states[256]);

// The 256 states' low K bits -> packed tile (exllamav3 `pack_trellis`). Only the chunks are stored, so
// unpacking returns the same states iff Exl3StatesTailBiting(states, K).
void Exl3PackTileStates(const uint16_t states[256], int K, uint16_t* tile);

// True when every state continues its predecessor: s_t >> K == s_{t-1} & (2^(16-K) - 1), t = 0..255,
// with s_{-1} = s_255.
bool Exl3StatesTailBiting(const uint16_t states[256], int K);

// Packed tile -> 256 fp16 bit patterns, row-major 16x16 (out[16 r + c]); exllamav3 `reconstruct` for
// one tile.
void Exl3DecodeTileFp16(const uint16_t* tile, int K, Exl3Codebook cb, uint16_t out[256]);

}  // namespace dsmesh

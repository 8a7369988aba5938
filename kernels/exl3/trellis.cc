#include "kernels/exl3/trellis.h"

#include <stdexcept>
#include <string>

namespace dsmesh {
namespace {

void CheckK(int K) {
  if (K < kExl3MinK || K > kExl3MaxK) throw std::invalid_argument("EXL3 tile: K=" + std::to_string(K) + " out of 1..8");
}

// Stream bit p (0 <= p < 256K) of a packed tile.
inline uint32_t StreamBit(const uint16_t* tile, int K, int64_t p) {
  const int64_t total = 256 * K;
  p = ((p % total) + total) % total;
  const int64_t w = p / 32;
  const uint32_t word = static_cast<uint32_t>(tile[2 * w]) | (static_cast<uint32_t>(tile[2 * w + 1]) << 16);
  return (word >> (31 - p % 32)) & 1u;
}

}  // namespace

void Exl3UnpackTileStates(const uint16_t* tile, int K, uint16_t states[256]) {
  CheckK(K);
  for (int t = 0; t < 256; ++t) {
    uint32_t s = 0;
    const int64_t end = static_cast<int64_t>(t + 1) * K;  // window [end-16, end), MSB first
    for (int j = 0; j < 16; ++j) s = (s << 1) | StreamBit(tile, K, end - 16 + j);
    states[t] = static_cast<uint16_t>(s);
  }
}

void Exl3PackTileStates(const uint16_t states[256], int K, uint16_t* tile) {
  CheckK(K);
  uint32_t words[64] = {};  // 8K 32-bit words, MSB-first
  for (int t = 0; t < 256; ++t) {
    const uint32_t chunk = states[t] & ((1u << K) - 1);
    for (int b = 0; b < K; ++b) {
      const int p = t * K + b;  // stream bit receiving chunk bit (K-1-b)
      if ((chunk >> (K - 1 - b)) & 1u) words[p / 32] |= 1u << (31 - p % 32);
    }
  }
  for (int w = 0; w < 8 * K; ++w) {
    tile[2 * w] = static_cast<uint16_t>(words[w] & 0xFFFF);
    tile[2 * w + 1] = static_cast<uint16_t>(words[w] >> 16);
  }
}

bool Exl3StatesTailBiting(const uint16_t states[256], int K) {
  CheckK(K);
  const uint32_t low_mask = (1u << (16 - K)) - 1;
  for (int t = 0; t < 256; ++t) {
    const uint32_t prev = states[(t + 255) % 256];
    if ((static_cast<uint32_t>(states[t]) >> K) != (prev & low_mask)) return false;
  }
  return true;
}

void Exl3DecodeTileFp16(const uint16_t* tile, int K, Exl3Codebook cb, uint16_t out[256]) {
  uint16_t states[256];
  Exl3UnpackTileStates(tile, K, states);
  for (int t = 0; t < 256; ++t) out[16 * Exl3TileRow(t) + Exl3TileCol(t)] = Exl3CodebookFp16(cb, states[t]);
}

}  // namespace dsmesh

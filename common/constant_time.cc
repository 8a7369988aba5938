#include "common/constant_time.h"

#include <cstddef>

namespace dsmesh {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of b is read whatever a holds; a differing length is folded into the same accumulator.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = b.size();
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  // Compiler barrier: the loop must not be shortened into an early exit.
  asm volatile("" : "+r"(diff));
  return diff == 0;
}

}  // namespace dsmesh

// The clock every `dsmesh bench` mode times with: monotonic, so a wall-clock adjustment during a run
// cannot bend a figure.
#pragma once

#include <chrono>

namespace dsmesh {

using BenchClock = std::chrono::steady_clock;

// Seconds from `t0` to now.
inline double SecondsSince(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}

}  // namespace dsmesh

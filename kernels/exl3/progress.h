// A progress bar on stderr for long encoder runs: redrawn in place on a terminal (at most 4 times a
// second), one line per 10% otherwise (logs stay readable).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dsmesh {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  // Thread-compatible: call from one thread. Prints when enough time or progress has passed.
  void Update(int64_t done, int64_t total);
  void Finish();  // ends the line

 private:
  std::string label_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_;
  int last_decile_ = -1;
  bool drawn_ = false;
};

}  // namespace dsmesh

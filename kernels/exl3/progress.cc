#include "kernels/exl3/progress.h"

#include <unistd.h>

#include <cstdio>

namespace dsmesh {

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), tty_(isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()), last_(start_) {}

void ProgressBar::Update(int64_t done, int64_t total) {
  if (total <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int decile = static_cast<int>(10 * done / total);
  if (tty_ ? (now - last_ < std::chrono::milliseconds(250) && done < total) : decile == last_decile_) return;
  last_ = now;
  last_decile_ = decile;
  const double frac = double(done) / total;
  const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
  char bar[31];
  const int filled = static_cast<int>(frac * 30);
  for (int i = 0; i < 30; ++i) bar[i] = i < filled ? '#' : '.';
  bar[30] = 0;
  std::fprintf(stderr, "%s%s [%s] %3.0f%% %lld/%lld tiles, %.1f s, ETA %.0f s%s", tty_ ? "\r" : "", label_.c_str(), bar,
               100 * frac, static_cast<long long>(done), static_cast<long long>(total), elapsed, eta, tty_ ? "" : "\n");
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (drawn_ && tty_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace dsmesh

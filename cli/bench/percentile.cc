#include "cli/bench/percentile.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace dsmesh {

double Percentile(std::vector<double> values, double p) {
  if (!(p >= 0 && p <= 100)) throw std::invalid_argument("percentile " + std::to_string(p) + " is outside 0..100");
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  // Rank ceil(p/100 * n), 1-based; rank 0 (p 0) is the first value.
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * values.size()));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace dsmesh

// The one percentile every `dsmesh bench` mode reports (TTFT and inter-token p50/p99, a scenario's chat
// TTFT): nearest rank, so a reported figure is always one of the measured values.
#pragma once

#include <vector>

namespace dsmesh {

// The nearest-rank p-th percentile of `values`: the smallest value with at least p% of the values at or
// below it (p 0 is the minimum, p 100 the maximum). NaN when `values` is empty (the printers show "-" and
// JSON null). Throws std::invalid_argument for p outside 0..100.
double Percentile(std::vector<double> values, double p);

// The median of `values` (the mean of the two middle values when their count is even): the bench's
// "median run" of a --repeat series. 0 when `values` is empty.
double Median(std::vector<double> values);

}  // namespace dsmesh

// A small hand-written Prometheus text exposition (format 0.0.4): counters, gauges and histograms
// with labels, thread-safe, rendered on each scrape. prometheus-cpp is not packaged in Debian, and the
// gateway needs only this much. Formatting follows the Python prometheus_client that vLLM uses
// (bucket bounds as le="0.001", le="1.0", le="+Inf"), so vLLM dashboards match label-for-label.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dsmesh {

using Labels = std::vector<std::pair<std::string, std::string>>;  // ordered as written

// Formats a double the way Python's repr does for float (shortest round-trip, "1.0" not "1").
std::string PromFloat(double v);
// {a="x",b="y"} with \\, \" and \n escaped; empty string for no labels.
std::string PromLabels(const Labels& labels);

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // Appends name_bucket/name_sum/name_count lines.
  void Render(const std::string& name, const Labels& labels, std::string* out) const;
  uint64_t count() const;
  double sum() const;

 private:
  const std::vector<double> bounds_;  // ascending upper bounds, +Inf implied
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), size bounds_+1
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Counter {
 public:
  void Add(double v);
  double value() const;

 private:
  mutable std::mutex mu_;
  double value_ = 0;
};

// Appends "# HELP" and "# TYPE" lines for one metric family.
void PromFamilyHeader(const std::string& name, const std::string& type, const std::string& help,
                      std::string* out);
// Appends one sample line: name{labels} value.
void PromSample(const std::string& name, const Labels& labels, double value, std::string* out);

// vLLM's 1-2-5 bucket series up to max_value: 1, 2, 5, 10, 20, 50, ... (build_1_2_5_buckets).
std::vector<double> Buckets125(double max_value);

}  // namespace dsmesh

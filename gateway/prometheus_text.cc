#include "gateway/prometheus_text.h"

#include <charconv>
#include <cmath>

namespace dsmesh {

std::string PromFloat(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string PromLabels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) out += ',';
    out += labels[i].first;
    out += "=\"";
    for (char c : labels[i].second) {
      if (c == '\\') out += "\\\\";
      else if (c == '"') out += "\\\"";
      else if (c == '\n') out += "\\n";
      else out += c;
    }
    out += '"';
  }
  out += '}';
  return out;
}

void PromFamilyHeader(const std::string& name, const std::string& type, const std::string& help,
                      std::string* out) {
  *out += "# HELP " + name + " ";
  for (char c : help) {
    if (c == '\\') *out += "\\\\";
    else if (c == '\n') *out += "\\n";
    else *out += c;
  }
  *out += "\n# TYPE " + name + " " + type + "\n";
}

void PromSample(const std::string& name, const Labels& labels, double value, std::string* out) {
  *out += name + PromLabels(labels) + " " + PromFloat(value) + "\n";
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;  // le semantics: v <= bound
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

double Histogram::sum() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sum_;
}

void Histogram::Render(const std::string& name, const Labels& labels, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    Labels with_le = labels;
    with_le.emplace_back("le", i < bounds_.size() ? PromFloat(bounds_[i]) : "+Inf");
    PromSample(name + "_bucket", with_le, static_cast<double>(cumulative), out);
  }
  PromSample(name + "_sum", labels, sum_, out);
  PromSample(name + "_count", labels, static_cast<double>(count_), out);
}

void Counter::Add(double v) {
  std::lock_guard<std::mutex> lock(mu_);
  value_ += v;
}

double Counter::value() const {
  std::lock_guard<std::mutex> lock(mu_);
  return value_;
}

std::vector<double> Buckets125(double max_value) {
  std::vector<double> out;
  for (double exponent = 1;; exponent *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      double v = m * exponent;
      if (v > max_value) return out;
      out.push_back(v);
    }
  }
}

}  // namespace dsmesh

#include "common/flags.h"

#include <cerrno>
#include <cstdlib>

namespace dsmesh {

Flags::Flags(const std::vector<std::string>& args, const std::set<std::string>& known,
             const std::set<std::string>& boolean) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (!known.count(name)) throw UsageError("unknown flag --" + name);
    if (!has_value) {
      if (boolean.count(name)) {
        value = "true";
      } else {
        if (i + 1 >= args.size()) throw UsageError("flag --" + name + " needs a value");
        value = args[++i];
      }
    }
    values_[name] = value;
  }
}

std::string Flags::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Flags::Require(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw UsageError("missing required flag --" + name);
  return it->second;
}

long long Flags::GetInt(const std::string& name, long long fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end) throw UsageError("flag --" + name + ": not an integer: " + it->second);
  return v;
}

double Flags::GetDouble(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end) throw UsageError("flag --" + name + ": not a number: " + it->second);
  return v;
}

bool Flags::GetBool(const std::string& name, bool fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  if (it->second == "true" || it->second == "1") return true;
  if (it->second == "false" || it->second == "0") return false;
  throw UsageError("flag --" + name + ": expected true or false, got " + it->second);
}

std::vector<std::string> SplitCommaList(const std::string& text) {
  std::vector<std::string> items;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    items.push_back(text.substr(i, j - i));
    i = j + 1;
  }
  return items;
}

std::vector<int32_t> ParseIntList(const std::string& flag, const std::string& text, const std::string& what) {
  std::vector<int32_t> out;
  for (const std::string& item : SplitCommaList(text)) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw UsageError("--" + flag + ": \"" + item + "\" is not an " + what + " (expected e.g. 5,17,9)");
    if (v < 0 || v > INT32_MAX) throw UsageError("--" + flag + ": " + what + " " + item + " is out of range");
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

int EnvInt(const char* name, int lo, int hi, int otherwise) {
  const char* v = std::getenv(name);
  if (!v) return otherwise;
  char* end = nullptr;
  errno = 0;
  const long c = std::strtol(v, &end, 10);
  if (end == v || *end != 0 || errno == ERANGE || c < lo || c > hi)
    throw std::runtime_error(std::string(name) + "='" + v + "': expected an integer " + std::to_string(lo) + ".." +
                             std::to_string(hi));
  return static_cast<int>(c);
}

}  // namespace dsmesh

// Minimal flag parsing shared by the CLI subcommands and the binaries: `--name value` or `--name=value`.
// Unknown flags are an error that names the flag, so typos never pass silently.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsmesh {

class Flags {
 public:
  // `known` lists accepted flag names (without dashes); `boolean` those that take no value.
  Flags(const std::vector<std::string>& args, const std::set<std::string>& known,
        const std::set<std::string>& boolean = {});

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  std::string Require(const std::string& name) const;  // throws naming the missing flag
  long long GetInt(const std::string& name, long long fallback) const;
  double GetDouble(const std::string& name, double fallback) const;
  bool GetBool(const std::string& name, bool fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// Thrown for bad command-line input; the CLI prints the message and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The items of a comma-separated list, empty ones included ("1,,2" -> "1", "", "2"; "" -> one empty item).
std::vector<std::string> SplitCommaList(const std::string& text);

// The value of --flag as a comma-separated list of non-negative 32-bit integers ("5,17,9"). Throws
// UsageError naming the flag: an item that is not an integer ("--tokens: \"x\" is not an integer
// token id" with what = "integer token id"; an empty value or item is one) or one out of range.
std::vector<int32_t> ParseIntList(const std::string& flag, const std::string& text, const std::string& what);

// The integer in environment variable `name`, or `otherwise` when it is unset. A value that is not an
// integer in lo..hi throws std::runtime_error naming the variable, the value and the range (tuning knobs
// such as DSMESH_EXL3_GEMV_CTAS_PER_SM).
int EnvInt(const char* name, int lo, int hi, int otherwise);

}  // namespace dsmesh

// JSON text exactly as DeepSeek's Python tooling writes it. The DeepSeek-V4 prompt embeds tool schemas
// and tool-call arguments through Python's `json.dumps(value, ensure_ascii=False)`, so a prompt is only
// byte-identical to the official encoder when we reproduce that serializer: ", " and ": " separators,
// key order as parsed, floats in Python repr form (1e-05, 1e+16, 100.0), non-ASCII left raw, and only
// control characters, '"' and '\' escaped (lower-case \u00XX).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dsmesh {

// Python's json.dumps(value, ensure_ascii=False) for a parsed value (key order preserved).
std::string PythonJsonDumps(const nlohmann::ordered_json& value);

// Python's json.dumps for one string (quotes included).
std::string PythonJsonQuote(std::string_view utf8);

// Python's repr(float): shortest round-trip digits, exponent form when the decimal point would sit
// more than 16 places left or 4 places right of the first digit, ".0" on integral values.
std::string PythonFloatRepr(double value);

// Text that is not JSON.
struct JsonSyntaxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// JSON that Python reads exactly but this library cannot: integers beyond 64 bits (it would round
// them to doubles) and numbers beyond the double range (Python reads them as infinity).
struct JsonRangeError : std::runtime_error {
  JsonRangeError(const std::string& message, std::string key = "")
      : std::runtime_error(message), top_level_key(std::move(key)) {}
  std::string top_level_key;  // the key of the top-level object member holding the number ("" if none)
};

// Objects and arrays nested deeper than this are refused by ParseJsonText (JsonSyntaxError).
inline constexpr int kMaxJsonDepth = 512;

// Parses JSON text keeping object key order (duplicate keys: last value at the first key's position,
// as Python's json.loads does). Messages name `what` (a file or field).
nlohmann::ordered_json ParseJsonText(std::string_view text, const std::string& what);

}  // namespace dsmesh

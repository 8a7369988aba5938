#include "common/chat/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace dsmesh {
namespace {

void AppendQuoted(std::string_view s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void AppendValue(const nlohmann::ordered_json& v, std::string* out) {
  using Type = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case Type::null: out->append("null"); break;
    case Type::boolean: out->append(v.get<bool>() ? "true" : "false"); break;
    case Type::number_integer: out->append(std::to_string(v.get<int64_t>())); break;
    case Type::number_unsigned: out->append(std::to_string(v.get<uint64_t>())); break;
    case Type::number_float: out->append(PythonFloatRepr(v.get<double>())); break;
    case Type::string: AppendQuoted(v.get_ref<const std::string&>(), out); break;
    case Type::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out->append(", ");
        first = false;
        AppendValue(item, out);
      }
      out->push_back(']');
      break;
    }
    case Type::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out->append(", ");
        first = false;
        AppendQuoted(key, out);
        out->append(": ");
        AppendValue(item, out);
      }
      out->push_back('}');
      break;
    }
    case Type::binary:
    case Type::discarded:
      throw std::runtime_error("PythonJsonDumps: value has no JSON form (binary or discarded)");
  }
}

// The DOM builder of the JSON library, plus a check on number lexemes: an integer literal that did
// not fit 64 bits arrives here as a float and would be rounded.
class StrictDomParser : public nlohmann::detail::json_sax_dom_parser<nlohmann::ordered_json> {
 public:
  using Base = nlohmann::detail::json_sax_dom_parser<nlohmann::ordered_json>;
  StrictDomParser(nlohmann::ordered_json& root, const std::string& what)
      : Base(root, /*allow_exceptions=*/true), what_(what) {}

  bool number_float(double value, const std::string& lexeme) {
    if (lexeme.find_first_of(".eE") == std::string::npos)
      throw JsonRangeError(what_ + ": integer " + lexeme + " does not fit in 64 bits", top_key_);
    return Base::number_float(value, lexeme);
  }

  bool key(std::string& k) {
    if (depth_ == 1) top_key_ = k;
    return Base::key(k);
  }
  const std::string& top_key() const { return top_key_; }

  // Nesting is bounded here, while parsing: the serializers and walkers that later see the value
  // (PythonJsonDumps, the JSON library's dump) recurse once per level.
  bool start_object(std::size_t n) {
    Enter();
    return Base::start_object(n);
  }
  bool start_array(std::size_t n) {
    Enter();
    return Base::start_array(n);
  }
  bool end_object() {
    --depth_;
    return Base::end_object();
  }
  bool end_array() {
    --depth_;
    return Base::end_array();
  }

 private:
  void Enter() {
    if (++depth_ > kMaxJsonDepth)
      throw JsonSyntaxError(what_ + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  std::string what_;
  std::string top_key_;
  int depth_ = 0;
};

}  // namespace

std::string PythonFloatRepr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits in scientific form, e.g. "-1.2345e+17", then laid out like Python.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  int decpt = exponent + 1;  // position of the decimal point relative to the first digit
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

std::string PythonJsonQuote(std::string_view utf8) {
  std::string out;
  AppendQuoted(utf8, &out);
  return out;
}

std::string PythonJsonDumps(const nlohmann::ordered_json& value) {
  std::string out;
  AppendValue(value, &out);
  return out;
}

nlohmann::ordered_json ParseJsonText(std::string_view text, const std::string& what) {
  nlohmann::ordered_json root;
  StrictDomParser sax(root, what);
  try {
    nlohmann::ordered_json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const nlohmann::json::out_of_range& e) {
    throw JsonRangeError(what + ": number out of range: " + e.what(), sax.top_key());
  } catch (const nlohmann::json::exception& e) {
    throw JsonSyntaxError(what + ": invalid JSON: " + e.what());
  }
  return root;
}

}  // namespace dsmesh

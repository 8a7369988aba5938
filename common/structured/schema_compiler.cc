#include "common/structured/schema_compiler.h"

#include <cmath>
#include <functional>
#include <optional>
#include <map>
#include <set>

namespace dsmesh::structured {

namespace {

using json = nlohmann::json;

constexpr long long kMaxMagnitude = 999999999999999LL;  // 15 digits: exact in a double

std::string Dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::strict); }

const std::set<std::string> kAnnotations = {"title",    "description", "default",  "examples", "$schema",
                                            "$id",      "$comment",    "deprecated", "readOnly", "writeOnly",
                                            "$defs",    "definitions", "strict",   "discriminator"};
const std::set<std::string> kKeywords = {
    "type",    "properties", "required",   "additionalProperties", "items",    "minItems",  "maxItems",
    "enum",    "const",      "anyOf",      "oneOf",                "allOf",    "$ref",      "nullable",
    "format",  "pattern",    "minLength",  "maxLength",            "minimum",  "maximum",   "exclusiveMinimum",
    "exclusiveMaximum",      "uniqueItems", "additionalItems"};

class Compiler {
 public:
  Compiler(Nfa& nfa, const json& root, const CompileLimits& limits) : nfa_(nfa), root_(root), limits_(limits) {}

  Frag Value(const json& s, const std::string& path) {
    if (s.is_boolean()) return s.get<bool>() ? Any(limits_.any_depth) : nfa_.Nothing();
    if (!s.is_object()) throw GrammarError("a schema must be an object or a boolean", path);
    for (const auto& [k, v] : s.items())
      if (!kKeywords.count(k) && !kAnnotations.count(k))
        throw GrammarError("the JSON Schema keyword '" + k + "' is not supported", path + "/" + k);
    if (s.contains("nullable") && s["nullable"] == true) {
      json copy = s;
      copy.erase("nullable");
      return nfa_.Alt({Value(copy, path), nfa_.Literal("null")});
    }
    if (auto r = s.find("$ref"); r != s.end()) return Ref(*r, path);
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) throw GrammarError("'enum' must be a non-empty array", path + "/enum");
      std::vector<Frag> options;
      for (const auto& v : *e) options.push_back(nfa_.Literal(Dump(v)));
      return nfa_.Alt(options);
    }
    if (auto c = s.find("const"); c != s.end()) return nfa_.Literal(Dump(*c));
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto a = s.find(key); a != s.end()) {
        if (!a->is_array() || a->empty())
          throw GrammarError(std::string("'") + key + "' must be a non-empty array", path + "/" + key);
        std::vector<Frag> options;
        for (size_t i = 0; i < a->size(); ++i) {
          // Sibling keywords (a shared "type", say) apply to every branch.
          json branch = (*a)[i];
          if (branch.is_object())
            for (const auto& [k, v] : s.items())
              if (k != key && !kAnnotations.count(k) && !branch.contains(k)) branch[k] = v;
          options.push_back(Value(branch, path + "/" + key + "/" + std::to_string(i)));
        }
        return nfa_.Alt(options);
      }
    }
    if (auto a = s.find("allOf"); a != s.end()) {
      if (!a->is_array() || a->size() != 1)
        throw GrammarError("'allOf' is supported with exactly one schema", path + "/allOf");
      json merged = (*a)[0];
      if (!merged.is_object()) throw GrammarError("'allOf' must hold a schema object", path + "/allOf/0");
      for (const auto& [k, v] : s.items())
        if (k != "allOf" && !merged.contains(k)) merged[k] = v;
      return Value(merged, path + "/allOf/0");
    }
    auto t = s.find("type");
    if (t == s.end()) {
      if (s.contains("properties") || s.contains("additionalProperties")) return Object(s, path);
      if (s.contains("items")) return Array(s, path);
      if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength"))
        return String(s, path);
      return Any(limits_.any_depth);
    }
    if (t->is_array()) {
      std::vector<Frag> options;
      for (const auto& one : *t) {
        if (!one.is_string()) throw GrammarError("'type' must be a string or an array of strings", path + "/type");
        options.push_back(Typed(one.get<std::string>(), s, path));
      }
      if (options.empty()) throw GrammarError("'type' must not be an empty array", path + "/type");
      return nfa_.Alt(options);
    }
    if (!t->is_string()) throw GrammarError("'type' must be a string or an array of strings", path + "/type");
    return Typed(t->get<std::string>(), s, path);
  }

  // The raw (unquoted) text of a string schema, for DSML string="true" parameters: no '<' (it would
  // open a DSML marker) and no carriage returns.
  Frag RawString(const json& s, const std::string& path) {
    if (auto e = s.find("enum"); e != s.end()) {
      std::vector<Frag> options;
      for (const auto& v : *e) {
        if (!v.is_string()) throw GrammarError("a string parameter's enum must hold strings", path + "/enum");
        options.push_back(nfa_.Literal(v.get<std::string>()));
      }
      if (options.empty()) throw GrammarError("'enum' must be a non-empty array", path + "/enum");
      return nfa_.Alt(options);
    }
    if (auto c = s.find("const"); c != s.end() && c->is_string()) return nfa_.Literal(c->get<std::string>());
    return StringBody(s, path, /*json=*/false);
  }

  Frag Any(int depth) {
    std::vector<Frag> options = {GenericString(), Number(json::object(), ""), nfa_.Literal("true"),
                                 nfa_.Literal("false"), nfa_.Literal("null")};
    if (depth > 0) {
      options.push_back(ArrayOf([&] { return Any(depth - 1); }, 0, -1));
      options.push_back(MapOf([&] { return Any(depth - 1); }));
    }
    return nfa_.Alt(options);
  }

  Frag MapOf(const std::function<Frag()>& value) {
    auto member = [&] { return nfa_.Seq({GenericString(), nfa_.Literal(":"), value()}); };
    Frag members = nfa_.Seq({member(), nfa_.Star(nfa_.Seq({nfa_.Literal(","), member()}))});
    return nfa_.Seq({nfa_.Literal("{"), nfa_.Opt(members), nfa_.Literal("}")});
  }

  Frag ArrayOf(const std::function<Frag()>& item, int min, int max) {
    if (max == 0) return nfa_.Literal("[]");
    auto rest = [&] { return nfa_.Seq({nfa_.Literal(","), item()}); };
    Frag items = nfa_.Seq({item(), nfa_.Repeat(rest, std::max(0, min - 1), max < 0 ? -1 : max - 1)});
    return nfa_.Seq({nfa_.Literal("["), min > 0 ? items : nfa_.Opt(items), nfa_.Literal("]")});
  }

  // Properties in schema order, each optional one may be left out: state "after property j" may go on
  // with any later property k as long as no required property between them is skipped.
  Frag OrderedMembers(const std::vector<std::function<Frag()>>& items, const std::vector<bool>& required,
                      const std::string& separator) {
    const int n = static_cast<int>(items.size());
    std::vector<int32_t> after(n + 1);  // after[0]: nothing emitted yet; after[j + 1]: item j emitted last
    for (auto& a : after) a = nfa_.NewState();
    int32_t done = nfa_.NewState();
    std::vector<Frag> bodies(n);
    for (int k = 0; k < n; ++k) {
      bodies[k] = items[k]();
      nfa_.Eps(bodies[k].end, after[k + 1]);
    }
    for (int j = -1; j < n; ++j) {
      bool required_left = false;
      for (int k = j + 1; k < n; ++k) {
        if (j < 0) {
          nfa_.Eps(after[0], bodies[k].start);
        } else {
          Frag sep = nfa_.Literal(separator);
          nfa_.Eps(after[j + 1], sep.start);
          nfa_.Eps(sep.end, bodies[k].start);
        }
        if (required[k]) {
          required_left = true;
          break;
        }
      }
      if (!required_left) nfa_.Eps(after[j + 1], done);
    }
    return {after[0], done};
  }

 private:
  Frag Typed(const std::string& type, const json& s, const std::string& path) {
    if (type == "string") return String(s, path);
    if (type == "integer") return Integer(s, path);
    if (type == "number") return Number(s, path);
    if (type == "boolean") return nfa_.Alt({nfa_.Literal("true"), nfa_.Literal("false")});
    if (type == "null") return nfa_.Literal("null");
    if (type == "array") return Array(s, path);
    if (type == "object") return Object(s, path);
    throw GrammarError("unknown type '" + type + "'", path + "/type");
  }

  Frag Ref(const json& ref, const std::string& path) {
    if (!ref.is_string()) throw GrammarError("'$ref' must be a string", path + "/$ref");
    const std::string r = ref.get<std::string>();
    const json* target = nullptr;
    if (r == "#") {
      target = &root_;
    } else if (r.rfind("#/", 0) == 0) {
      try {
        target = &root_.at(json::json_pointer(r.substr(1)));
      } catch (const std::exception&) {
        throw GrammarError("'$ref' " + r + " does not resolve", path + "/$ref");
      }
    } else {
      throw GrammarError("'$ref' " + r + " is not supported: only references into this schema (#...)", path + "/$ref");
    }
    int& depth = ref_depth_[r];
    if (depth >= limits_.max_recursion) return nfa_.Nothing();  // recursion unrolled this far: stop here
    ++depth;
    Frag f = Value(*target, r.substr(1));
    --depth;
    return f;
  }

  Frag JsonChar() {
    Frag plain = nfa_.Utf8CharExcept([](uint8_t b) { return b < 0x20 || b == '"' || b == '\\'; });
    Frag simple = nfa_.Seq({nfa_.Literal("\\"), nfa_.Alt({nfa_.Range('"', '"'), nfa_.Range('\\', '\\'),
                                                          nfa_.Range('/', '/'), nfa_.Range('b', 'b'),
                                                          nfa_.Range('f', 'f'), nfa_.Range('n', 'n'),
                                                          nfa_.Range('r', 'r'), nfa_.Range('t', 't')})});
    return nfa_.Alt({plain, simple});
  }

  Frag GenericString() { return nfa_.Seq({nfa_.Literal("\""), nfa_.Star(JsonChar()), nfa_.Literal("\"")}); }

  static const char* FormatRegex(const std::string& f) {
    if (f == "date")
      return "[0-9]{4}-(02-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(0[1-9]|[12][0-9]|30)|(0[13578]|1[02])-31)";
    if (f == "time") return "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    if (f == "date-time")
      return "[0-9]{4}-(02-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(0[1-9]|[12][0-9]|30)|(0[13578]|1[02])-31)"
             "T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    if (f == "email") return "[a-zA-Z0-9._%+-]{1,32}@[a-zA-Z0-9-]{1,32}(\\.[a-zA-Z0-9-]{1,16}){1,3}";
    if (f == "uuid") return "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
    if (f == "ipv4") return "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    if (f == "hostname") return "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?){0,3}";
    if (f == "uri") return "https?://[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]{1,16}){1,3}(/[a-zA-Z0-9._~-]{1,20}){0,4}";
    return nullptr;
  }

  Frag StringBody(const json& s, const std::string& path, bool json_mode) {
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (auto f = s.find("format"); f != s.end()) {
      if (!f->is_string()) throw GrammarError("'format' must be a string", path + "/format");
      const char* re = FormatRegex(f->get<std::string>());
      if (!re) throw GrammarError("string format '" + f->get<std::string>() + "' is not supported", path + "/format");
      if (s.contains("pattern")) throw GrammarError("'format' together with 'pattern' is not supported", path);
      return CompileRegex(nfa_, re, json_mode);
    }
    if (auto p = s.find("pattern"); p != s.end()) {
      if (!p->is_string()) throw GrammarError("'pattern' must be a string", path + "/pattern");
      if (has_len) throw GrammarError("'pattern' together with 'minLength'/'maxLength' is not supported", path);
      try {
        return CompileRegex(nfa_, p->get<std::string>(), json_mode);
      } catch (const GrammarError& e) {
        throw GrammarError(std::string("'pattern': ") + e.what(), path + "/pattern");
      }
    }
    int min = static_cast<int>(Count(s, "minLength", 0, path));
    int max = s.contains("maxLength") ? static_cast<int>(Count(s, "maxLength", -1, path)) : -1;
    if (max >= 0 && max < min) throw GrammarError("'maxLength' is below 'minLength'", path + "/maxLength");
    if (max > 2000 || min > 2000) throw GrammarError("'minLength'/'maxLength' over 2000 are not supported", path);
    if (json_mode) return nfa_.Repeat([&] { return JsonChar(); }, min, max);
    return nfa_.Repeat([&] { return nfa_.Utf8CharExcept([](uint8_t b) { return b == '<' || b == '\r' || b == 0; }); },
                       min, max);
  }

  Frag String(const json& s, const std::string& path) {
    return nfa_.Seq({nfa_.Literal("\""), StringBody(s, path, true), nfa_.Literal("\"")});
  }

  long long Count(const json& s, const char* key, long long fallback, const std::string& path) {
    auto it = s.find(key);
    if (it == s.end()) return fallback;
    if (!it->is_number_integer() || it->get<long long>() < 0)
      throw GrammarError(std::string("'") + key + "' must be a non-negative integer", path + "/" + key);
    return it->get<long long>();
  }

  // Bounds of an integer or number schema as integers; `fraction_hi` is the largest integer part that
  // may carry a fraction (n + 0.x <= maximum).
  void Bounds(const json& s, const std::string& path, long long* lo, long long* hi, long long* fraction_hi) {
    *lo = -kMaxMagnitude;
    *hi = kMaxMagnitude;
    *fraction_hi = kMaxMagnitude;
    auto num = [&](const char* key) -> std::optional<double> {
      auto it = s.find(key);
      if (it == s.end() || it->is_boolean()) return std::nullopt;
      if (!it->is_number()) throw GrammarError(std::string("'") + key + "' must be a number", path + "/" + key);
      double v = it->get<double>();
      if (std::fabs(v) > 1e15) throw GrammarError(std::string("'") + key + "' beyond 1e15 is not supported", path + "/" + key);
      return v;
    };
    // Draft 4 spelled exclusive bounds as booleans beside minimum/maximum.
    const bool excl_min_bool = s.contains("exclusiveMinimum") && s["exclusiveMinimum"] == true;
    const bool excl_max_bool = s.contains("exclusiveMaximum") && s["exclusiveMaximum"] == true;
    if (auto v = num("minimum")) *lo = excl_min_bool ? static_cast<long long>(std::floor(*v)) + 1 : static_cast<long long>(std::ceil(*v));
    if (auto v = num("exclusiveMinimum")) *lo = std::max(*lo, static_cast<long long>(std::floor(*v)) + 1);
    if (auto v = num("maximum")) {
      *hi = excl_max_bool ? static_cast<long long>(std::ceil(*v)) - 1 : static_cast<long long>(std::floor(*v));
      *fraction_hi = static_cast<long long>(std::floor(*v)) - 1;
    }
    if (auto v = num("exclusiveMaximum")) {
      *hi = std::min(*hi, static_cast<long long>(std::ceil(*v)) - 1);
      *fraction_hi = std::min(*fraction_hi, static_cast<long long>(std::floor(*v)) - 1);
    }
    if (*lo > *hi) throw GrammarError("the bounds admit no value", path);
  }

  // Decimal strings of one length between a and b (same number of digits).
  Frag SameLength(const std::string& a, const std::string& b, size_t i) {
    const size_t n = a.size();
    if (i == n) return nfa_.Empty();
    if (a[i] == b[i]) return nfa_.Seq({nfa_.Range(a[i], a[i]), SameLength(a, b, i + 1)});
    bool low_min = true, high_max = true;
    for (size_t k = i + 1; k < n; ++k) {
      low_min &= a[k] == '0';
      high_max &= b[k] == '9';
    }
    auto full = [&](char lo, char hi) {
      std::vector<Frag> parts = {nfa_.Range(lo, hi)};
      for (size_t k = i + 1; k < n; ++k) parts.push_back(nfa_.Range('0', '9'));
      return nfa_.Seq(parts);
    };
    if (low_min && high_max) return full(a[i], b[i]);
    std::vector<Frag> options;
    char lo = a[i], hi = b[i];
    if (!low_min) {
      std::string top = a;
      for (size_t k = i + 1; k < n; ++k) top[k] = '9';
      options.push_back(nfa_.Seq({nfa_.Range(a[i], a[i]), SameLength(a, top, i + 1)}));
      ++lo;
    }
    if (!high_max) {
      std::string bottom = b;
      for (size_t k = i + 1; k < n; ++k) bottom[k] = '0';
      options.push_back(nfa_.Seq({nfa_.Range(b[i], b[i]), SameLength(bottom, b, i + 1)}));
      --hi;
    }
    if (lo <= hi) options.push_back(full(lo, hi));
    return nfa_.Alt(options);
  }

  // Decimal strings of a..b. A run of lengths of two digits or more that the bounds leave whole is one
  // fragment, [1-9][0-9]{m,n}, not one per length: a number without bounds has ~4x fewer NFA states
  // (a free JSON value nested 3 deep builds 85 of them).
  Frag NonNegative(long long a, long long b) {
    std::vector<Frag> options;
    long long p = 1;
    int whole_from = 0, whole_to = 0;  // the current run of whole lengths (0: none)
    auto close_run = [&] {
      if (!whole_from) return;
      options.push_back(nfa_.Seq({nfa_.Range('1', '9'),
                                  nfa_.Repeat([&] { return nfa_.Range('0', '9'); }, whole_from - 1, whole_to - 1)}));
      whole_from = 0;
    };
    for (int d = 1; d <= 16 && a <= b; ++d, p *= 10) {
      long long lo = d == 1 ? 0 : p, hi = p * 10 - 1;
      long long x = std::max(a, lo), y = std::min(b, hi);
      if (d > 1 && x == lo && y == hi) {
        if (!whole_from) whole_from = d;
        whole_to = d;
        continue;
      }
      close_run();
      if (x <= y) options.push_back(SameLength(std::to_string(x), std::to_string(y), 0));
    }
    close_run();
    if (options.empty()) return nfa_.Nothing();
    return nfa_.Alt(options);
  }

  Frag IntRange(long long lo, long long hi) {
    std::vector<Frag> options;
    if (hi >= 0) options.push_back(NonNegative(std::max(lo, 0LL), hi));
    if (lo < 0) options.push_back(nfa_.Seq({nfa_.Literal("-"), NonNegative(std::max(1LL, -hi), -lo)}));
    if (options.empty()) return nfa_.Nothing();
    return nfa_.Alt(options);
  }

  Frag Integer(const json& s, const std::string& path) {
    if (s.contains("multipleOf")) throw GrammarError("'multipleOf' is not supported", path + "/multipleOf");
    long long lo, hi, fhi;
    Bounds(s, path, &lo, &hi, &fhi);
    return IntRange(lo, hi);
  }

  Frag Number(const json& s, const std::string& path) {
    long long lo, hi, fhi;
    Bounds(s, path, &lo, &hi, &fhi);
    std::vector<Frag> options = {IntRange(lo, hi)};
    // Fractions only on non-negative integer parts n with n + 1 <= maximum (n.x stays within the bounds).
    long long flo = std::max(lo, 0LL);
    if (flo <= fhi)
      options.push_back(nfa_.Seq({NonNegative(flo, fhi), nfa_.Literal("."),
                                  nfa_.Repeat([&] { return nfa_.Range('0', '9'); }, 1, 6)}));
    return nfa_.Alt(options);
  }

  Frag Array(const json& s, const std::string& path) {
    if (s.contains("uniqueItems") && s["uniqueItems"] == true)
      throw GrammarError("'uniqueItems' is not supported", path + "/uniqueItems");
    if (s.contains("prefixItems")) throw GrammarError("'prefixItems' is not supported", path + "/prefixItems");
    int min = static_cast<int>(Count(s, "minItems", 0, path));
    int max = s.contains("maxItems") ? static_cast<int>(Count(s, "maxItems", -1, path)) : -1;
    if (max >= 0 && max < min) throw GrammarError("'maxItems' is below 'minItems'", path + "/maxItems");
    if (max > 256 || min > 256) throw GrammarError("'minItems'/'maxItems' over 256 are not supported", path);
    json items = s.contains("items") ? s["items"] : json(true);
    if (items.is_array()) throw GrammarError("'items' as an array (tuples) is not supported", path + "/items");
    return ArrayOf([&] { return Value(items, path + "/items"); }, min, max);
  }

  Frag Object(const json& s, const std::string& path) {
    for (const char* k : {"patternProperties", "minProperties", "maxProperties", "propertyNames"})
      if (s.contains(k)) throw GrammarError(std::string("'") + k + "' is not supported", path + "/" + k);
    auto props = s.find("properties");
    std::set<std::string> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) throw GrammarError("'required' must be an array of strings", path + "/required");
      for (const auto& x : *r) {
        if (!x.is_string()) throw GrammarError("'required' must be an array of strings", path + "/required");
        if (props == s.end() || !props->contains(x.get<std::string>()))
          throw GrammarError("required property '" + x.get<std::string>() + "' is not in 'properties'", path + "/required");
        required.insert(x.get<std::string>());
      }
    }
    if (props == s.end() || (props->is_object() && props->empty())) {
      auto ap = s.find("additionalProperties");
      if (ap != s.end() && *ap == false) return nfa_.Literal("{}");
      json value = ap != s.end() ? *ap : json(true);
      if (value == true) return MapOf([&] { return Any(limits_.any_depth - 1); });
      return MapOf([&] { return Value(value, path + "/additionalProperties"); });
    }
    if (!props->is_object()) throw GrammarError("'properties' must be an object", path + "/properties");
    std::vector<std::function<Frag()>> items;
    std::vector<bool> req;
    for (const auto& [name, sub] : props->items()) {
      const std::string key = Dump(json(name));
      const json* subp = &sub;
      const std::string subpath = path + "/properties/" + name;
      items.push_back([this, key, subp, subpath] {
        return nfa_.Seq({nfa_.Literal(key + ":"), Value(*subp, subpath)});
      });
      req.push_back(required.count(name) > 0);
    }
    return nfa_.Seq({nfa_.Literal("{"), OrderedMembers(items, req, ","), nfa_.Literal("}")});
  }

  Nfa& nfa_;
  const json& root_;
  CompileLimits limits_;
  std::map<std::string, int> ref_depth_;
};

// Whether the NFA accepts any string at all (a recursion with no base case, false schemas).
bool AcceptsSomething(const Nfa& nfa) {
  std::vector<char> seen(nfa.size(), 0);
  std::vector<int32_t> todo = {nfa.start};
  seen[nfa.start] = 1;
  while (!todo.empty()) {
    int32_t s = todo.back();
    todo.pop_back();
    if (s == nfa.accept) return true;
    for (int32_t t : nfa.states[s].eps)
      if (!seen[t]++) todo.push_back(t);
    for (const auto& e : nfa.states[s].edges)
      if (!seen[e.to]++) todo.push_back(e.to);
  }
  return false;
}

const json& Field(const json& spec, const char* key, const std::string& path) {
  auto it = spec.find(key);
  if (it == spec.end()) throw GrammarError(std::string("'") + key + "' is required", path);
  return *it;
}

}  // namespace

Nfa CompileSpec(const json& spec, const CompileLimits& limits) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    throw GrammarError("a structured-output spec must be an object with a string 'type'");
  const std::string type = spec["type"].get<std::string>();
  Nfa nfa;
  Frag root;
  if (type == "json_object") {
    Compiler c(nfa, spec, limits);
    root = c.MapOf([&] { return c.Any(limits.any_depth - 1); });
  } else if (type == "json_schema") {
    const json& schema = Field(spec, "schema", "");
    Compiler c(nfa, schema, limits);
    root = c.Value(schema, "");
  } else if (type == "regex") {
    const json& p = Field(spec, "pattern", "");
    if (!p.is_string()) throw GrammarError("'pattern' must be a string");
    root = CompileRegex(nfa, p.get<std::string>(), false);
  } else if (type == "choice") {
    const json& choices = Field(spec, "choices", "");
    if (!choices.is_array() || choices.empty()) throw GrammarError("'choices' must be a non-empty array of strings");
    std::vector<Frag> options;
    for (const auto& c : choices) {
      if (!c.is_string()) throw GrammarError("'choices' must be a non-empty array of strings");
      options.push_back(nfa.Literal(c.get<std::string>()));
    }
    root = nfa.Alt(options);
  } else if (type == "tool_calls") {
    const json& tools = Field(spec, "tools", "");
    if (!tools.is_array() || tools.empty()) throw GrammarError("'tools' must be a non-empty array");
    const int min_calls = spec.value("min_calls", 1), max_calls = spec.value("max_calls", 1);
    json empty_schema = json::object();
    auto invoke = [&]() {
      std::vector<Frag> options;
      for (size_t i = 0; i < tools.size(); ++i) {
        const json& tool = tools[i];
        const std::string name = tool.at("name").get<std::string>();
        const json& params = tool.contains("parameters") && !tool["parameters"].is_null() ? tool["parameters"] : empty_schema;
        const std::string path = "/tools/" + std::to_string(i) + "/parameters";
        Compiler c(nfa, params, limits);
        if (!params.is_object()) throw GrammarError("a tool's parameters must be a JSON Schema object", path);
        std::vector<std::function<Frag()>> items;
        std::vector<bool> req;
        std::set<std::string> required;
        if (auto r = params.find("required"); r != params.end() && r->is_array())
          for (const auto& x : *r)
            if (x.is_string()) required.insert(x.get<std::string>());
        if (auto props = params.find("properties"); props != params.end() && props->is_object()) {
          for (const auto& [key, sub] : props->items()) {
            const json* subp = &sub;
            const std::string subpath = path + "/properties/" + key;
            const bool raw = sub.is_object() && sub.contains("type") && sub["type"] == "string";
            items.push_back([&nfa, &c, key, subp, subpath, raw] {
              std::string open = std::string("<｜DSML｜parameter name=\"") + key + "\" string=\"" +
                                 (raw ? "true" : "false") + "\">";
              Frag value = raw ? c.RawString(*subp, subpath) : c.Value(*subp, subpath);
              return nfa.Seq({nfa.Literal(open), value, nfa.Literal("</｜DSML｜parameter>\n")});
            });
            req.push_back(required.count(key) > 0);
          }
        }
        Frag members = c.OrderedMembers(items, req, "");
        options.push_back(nfa.Seq({nfa.Literal("<｜DSML｜invoke name=\"" + name + "\">\n"), members,
                                   nfa.Literal("</｜DSML｜invoke>")}));
      }
      return nfa.Alt(options);
    };
    auto rest = [&] { return nfa.Seq({nfa.Literal("\n"), invoke()}); };
    root = nfa.Seq({nfa.Opt(nfa.Literal("\n\n")), nfa.Literal("<｜DSML｜tool_calls>\n"), invoke(),
                    nfa.Repeat(rest, std::max(0, min_calls - 1), max_calls < 0 ? -1 : max_calls - 1),
                    nfa.Literal("\n</｜DSML｜tool_calls>")});
  } else {
    throw GrammarError("unknown structured-output type '" + type + "'");
  }
  nfa.SetRoot(root);
  if (!AcceptsSomething(nfa)) throw GrammarError("the schema admits no value (recursion without a base case?)");
  return nfa;
}

}  // namespace dsmesh::structured

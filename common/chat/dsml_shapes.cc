#include "common/chat/dsml_shapes.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace dsmesh::dsml_shapes {
namespace {

using Strings = std::vector<std::string>;

const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kD = "｜DSML｜";

// splitmix64: the same numbers everywhere (std:: distributions differ between standard libraries).
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }
  bool Percent(int p) { return Below(100) < static_cast<size_t>(p); }
  template <class T>
  const T& Pick(const std::vector<T>& v) { return v[Below(v.size())]; }
};

// Python's json.dumps(s, ensure_ascii=False) for a UTF-8 string: nlohmann's dump escapes the same
// characters ('"', '\\', control characters; \b \f \n \r \t short, the rest as lower-case \u00xx).
std::string Quote(const std::string& s) { return nlohmann::json(s).dump(); }

// ---- values ----

const std::vector<std::string> kStrings = {
    "Paris", "", " ", "  padded both sides  ", "line1\nline2\n", "tab\there", "CRLF\r\nline", "quote \" and backslash \\",
    "control \x01 and \x1f chars", "日本語のテキスト", "emoji 👨‍👩‍👧 🏔 ✅",
    "e\u0301 combining, \u200b zero width, \u2028 sep",
    "42", "true", "null", "{\"looks\": [\"like\", \"json\"]}", "<b>html</b> & <tool_result>x</tool_result>",
    "</think> inside a value", "<think>", "<｜DSML｜invoke name=\"x\"> quoted opener",
    "</｜DSML｜invoke> and </｜DSML｜tool_calls> quoted closers", "<｜DSML｜parameter name=\"k\" string=\"true\">",
    "C:\\path\\to\\file.txt", "multi\n\n\nblank lines\n", "ends with a newline\n", "\n starts with a newline",
    "SELECT * FROM t WHERE a < 3 AND b > 4;", "a \"quoted\"\nline\\", "😀", "Ünïcödé ß ç", "x"};

// Plain strings: no markup and no characters a test failure would need escaping to show.
const std::vector<std::string> kPlainStrings = {"Paris", "東京", "Zürich 🏔", "hello world", "42", "a b c", ""};

const std::vector<std::string> kNumbers = {"0", "-42", "7", "3.14", "-0.0", "1e-05", "6.02E+23", "1E3",
                                           "18446744073709551615", "123456789012345678901234567890", "0.1",
                                           "-1.5e-300", "100.0"};
const std::vector<std::string> kStringLiterals = {
    "\"plain\"", "\"esc \\\" \\\\ \\/ \\n \\t \\u00e9 \\ud83d\\ude00\"", "\"日本\"", "\"emoji 😀\"", "\"\"",
    "\"<｜DSML｜invoke name=\\\"x\\\"> in JSON\""};
const std::vector<std::string> kJsonKeys = {"a", "b", "name", "値", "with space", "q\\\"uote", "nested", "k"};

enum class Style { kCompact, kPython, kSpaced, kPretty };

// A random JSON value written in `style` (the text is what the model writes; it is never reformatted).
std::string JsonValue(Rng& r, Style style, int depth, int indent) {
  const size_t kind = depth >= 3 ? r.Below(3) : r.Below(5);
  if (kind == 0) return r.Pick(kNumbers);
  if (kind == 1) return r.Pick(Strings{"true", "false", "null"});
  if (kind == 2) return r.Pick(kStringLiterals);
  const bool object = kind == 3;
  const size_t n = r.Below(4);
  if (n == 0) return object ? (style == Style::kSpaced ? "{ }" : "{}") : (style == Style::kSpaced ? "[ ]" : "[]");
  const std::string pad(static_cast<size_t>(indent + 2), ' '), end_pad(static_cast<size_t>(indent), ' ');
  std::string out = object ? "{" : "[";
  std::vector<std::string> keys = kJsonKeys;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += style == Style::kCompact ? "," : style == Style::kSpaced ? " , " : ",";
    if (style == Style::kPretty) out += "\n" + pad;
    else if (style == Style::kPython && i > 0) out += " ";
    else if (style == Style::kSpaced && i == 0) out += " ";
    if (object) {
      const size_t k = r.Below(keys.size());
      out += "\"" + keys[k] + "\"";
      keys.erase(keys.begin() + static_cast<long>(k));
      out += style == Style::kCompact ? ":" : style == Style::kSpaced ? " : " : ": ";
    }
    out += JsonValue(r, style, depth + 1, indent + 2);
  }
  if (style == Style::kPretty) out += "\n" + end_pad;
  else if (style == Style::kSpaced) out += " ";
  return out + (object ? "}" : "]");
}

std::string NonStringValue(Rng& r) {
  const Style style = static_cast<Style>(r.Below(4));
  std::string v = JsonValue(r, style, 0, 0);
  if (r.Percent(20)) v = r.Pick(Strings{" ", "\n", "  ", "\t"}) + v + r.Pick(Strings{" ", "\n", ""});
  return v;
}

const std::vector<std::string> kBadJson = {"Paris", "{\"a\": 1", "[1, 2,]", "NaN", "'single'", "", "01", "True",
                                           "1 2", "{a: 1}", "\"unterminated", "Infinity", "[1] x", " "};

// ---- the DSML text ----

struct Param {
  std::string key;
  bool is_string = true;
  std::string value;  // the text between the tags
  // Broken spellings of this parameter's opening / closing tag ("" = the right one).
  std::string opener_override, closer_override;
};

struct Invoke {
  std::string name;
  std::string space_before_name = " ";
  bool blank_line_after_name = false;
  std::vector<Param> params;
  std::string opener_override, closer_override;  // broken spellings ("" = the right one)
  bool omit_closer = false;
};

std::string ParamText(const Param& p) {
  std::string open = p.opener_override.empty()
                         ? "<" + kD + "parameter name=\"" + p.key + "\" string=\"" + (p.is_string ? "true" : "false") + "\">"
                         : p.opener_override;
  return open + p.value + (p.closer_override.empty() ? "</" + kD + "parameter>" : p.closer_override);
}

// `sep` is what the model writes between two tags (the official format: "\n").
std::string InvokeText(const Invoke& inv, const std::string& sep) {
  std::string out = inv.opener_override.empty()
                        ? "<" + kD + "invoke" + inv.space_before_name + "name=\"" + inv.name + "\">"
                        : inv.opener_override;
  out += sep;
  if (inv.blank_line_after_name) out += "\n";
  for (const Param& p : inv.params) out += ParamText(p) + sep;
  if (!inv.omit_closer) out += inv.closer_override.empty() ? "</" + kD + "invoke>" : inv.closer_override;
  return out;
}

std::string Arguments(const Invoke& inv) {
  std::string out = "{";
  for (size_t i = 0; i < inv.params.size(); ++i) {
    if (i) out += ", ";
    const Param& p = inv.params[i];
    out += Quote(p.key) + ": " + (p.is_string ? Quote(p.value) : p.value);
  }
  return out + "}";
}

const std::vector<std::string> kToolNames = {"get_weather", "search", "run-code", "fs.read_file", "ns__tool_v2",
                                             "天気", "arguments", "noop"};
const std::vector<std::string> kKeys = {"city", "location", "query", "q", "arguments", "name", "string",
                                        "type", "名前", "max_results", "a-b", "x.y", "path", "value", "n"};
const std::vector<std::string> kContents = {"", "Let me check.", "I'll call two tools:\n", "答えを調べます 🔍",
                                            "Result first\n\n", "  spaced  ", "Line one\nLine two"};
const std::vector<std::string> kReasonings = {"", "Need the weather.", "Multi\nline\n\nreasoning 🧠",
                                              "Think about <b>tags</b> & \"quotes\""};

Invoke RandomInvoke(Rng& r, bool plain, size_t min_params) {
  Invoke inv;
  inv.name = plain ? r.Pick(Strings{"get_weather", "search", "noop"}) : r.Pick(kToolNames);
  if (!plain) {
    inv.space_before_name = r.Pick(Strings{" ", " ", " ", " ", "  ", "\t", "\n", "", " \n "});
    inv.blank_line_after_name = r.Percent(15);
  }
  size_t n = r.Percent(15) ? 0 : 1 + r.Below(4);
  n = std::max(n, min_params);
  std::vector<std::string> keys = kKeys;
  for (size_t i = 0; i < n; ++i) {
    Param p;
    const size_t k = r.Below(keys.size());
    p.key = keys[k];
    keys.erase(keys.begin() + static_cast<long>(k));
    p.is_string = r.Percent(50);
    if (plain)
      p.value = p.is_string ? r.Pick(kPlainStrings) : r.Pick(Strings{"3", "true", "[1, 2]", "{\"a\": null}"});
    else
      p.value = p.is_string ? r.Pick(kStrings) : NonStringValue(r);
    inv.params.push_back(std::move(p));
  }
  return inv;
}

// A whole output: [reasoning "</think>"] content "\n\n" block [EOS], with offsets for the broken shapes.
struct Output {
  bool thinking = false;
  bool close_reasoning = true;  // thinking mode: "</think>" before the content
  std::string reasoning, content;
  std::string before_block = "\n\n";
  std::string block_name = "tool_calls";
  std::string closer_override;  // a broken spelling of the block's closing tag
  bool omit_block_closer = false;
  std::string sep = "\n";
  std::vector<Invoke> invokes;
  std::string garbage_at;  // broken: text written where an invoke would start
  size_t garbage_index = 0;
  std::string after_block;
  bool eos = true;

  std::string text;
  size_t block_start = 0;             // where the blank line before the block starts
  size_t opener_end = 0;              // after "<｜DSML｜tool_calls>"
  std::vector<size_t> invoke_end;     // after each invoke's closing tag
  size_t block_end = 0;               // after the block's closing tag

  void Render() {
    text.clear();
    invoke_end.clear();
    if (thinking) text += reasoning + (close_reasoning ? "</think>" : "");
    if (!thinking || close_reasoning) text += content;
    block_start = text.size();
    text += before_block + "<" + kD + block_name + ">";
    opener_end = text.size();
    text += sep;
    for (size_t i = 0; i < invokes.size(); ++i) {
      if (!garbage_at.empty() && garbage_index == i) text += garbage_at + sep;
      text += InvokeText(invokes[i], sep);
      invoke_end.push_back(text.size());
      text += sep;
    }
    if (!garbage_at.empty() && garbage_index == invokes.size()) text += garbage_at + sep;
    if (!omit_block_closer) text += closer_override.empty() ? "</" + kD + block_name + ">" : closer_override;
    block_end = text.size();
    text += after_block;
    if (eos) text += kEos;
  }
};

Output RandomOutput(Rng& r, bool plain, size_t min_invokes, size_t min_params) {
  Output o;
  o.thinking = r.Percent(50);
  o.reasoning = r.Pick(kReasonings);
  o.content = r.Pick(kContents);
  const size_t n = std::max(min_invokes, r.Percent(5) ? size_t{0} : r.Percent(50) ? size_t{1} : 2 + r.Below(3));
  for (size_t i = 0; i < n; ++i) o.invokes.push_back(RandomInvoke(r, plain, min_params));
  o.eos = r.Percent(85);
  return o;
}

// Expectations of a well-formed output (kOfficial / kLenient).
Shape WellFormed(Shape::Kind kind, const std::string& description, const Output& o) {
  Shape s;
  s.kind = kind;
  s.description = description;
  s.thinking = o.thinking;
  s.text = o.text;
  // The text before the block, less one blank line ("\n\n", the official separator) at its end.
  auto before_block = [&](const std::string& text) {
    std::string t = text + o.before_block;
    if (t.size() >= 2 && t.compare(t.size() - 2, 2, "\n\n") == 0) t.resize(t.size() - 2);
    return t;
  };
  if (o.thinking && !o.close_reasoning) {  // the block ends the reasoning
    s.reasoning = before_block(o.reasoning);
    s.content = o.after_block;
  } else {
    if (o.thinking) s.reasoning = o.reasoning;
    s.content = before_block(o.content) + o.after_block;
  }
  s.content_without_tools = s.content;
  for (const Invoke& inv : o.invokes) s.calls.push_back({inv.name, Arguments(inv)});
  return s;
}

// Expectations of a broken output whose first `complete` invokes parse: those are calls, everything from
// the end of the last of them (or from the blank line before the block) to EOS is content.
Shape Broken(const std::string& description, const Output& o, size_t complete) {
  Shape s;
  s.kind = Shape::Kind::kBroken;
  s.description = description;
  s.thinking = o.thinking;
  s.text = o.text;
  if (o.thinking) s.reasoning = o.reasoning;
  const std::string before = (!o.thinking || o.close_reasoning) ? o.content : "";
  const size_t from = complete == 0 ? o.block_start : o.invoke_end[complete - 1];
  const size_t to = o.eos ? o.text.size() - kEos.size() : o.text.size();
  s.content = before + o.text.substr(from, to - from);
  s.content_without_tools = before;
  for (size_t i = 0; i < complete; ++i) s.calls.push_back({o.invokes[i].name, Arguments(o.invokes[i])});
  s.malformed_blocks = 1;
  return s;
}

// The start of the UTF-8 character holding byte `i`.
size_t CharStart(const std::string& s, size_t i) {
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

Shape OfficialShape(Rng& r, size_t i) {
  Output o = RandomOutput(r, /*plain=*/false, 0, 0);
  o.Render();
  return WellFormed(Shape::Kind::kOfficial, "official #" + std::to_string(i), o);
}

Shape LenientShape(Rng& r, size_t i) {
  Output o = RandomOutput(r, /*plain=*/false, 1, 0);
  std::string what;
  switch (i % 9) {
    case 0:
      o.sep = r.Pick(Strings{"\r\n", "\n\n", "\n  ", "", " \t\n"}), what = "whitespace between tags";
      break;
    case 1: o.block_name = "function_calls", what = "V3.2 block name function_calls"; break;
    case 2:
      o.content = r.Pick(Strings{"Checking.", "x\n", "答え"}), o.before_block = "";
      what = "no blank line before the block";
      break;
    case 3:
      o.after_block = r.Pick(Strings{"\nDone.", " trailing text 🙂"}), what = "text after the block";
      break;
    case 4:
      o.thinking = true, o.close_reasoning = false, o.before_block = r.Percent(50) ? "\n\n" : "";
      what = "block inside unterminated reasoning";
      break;
    case 5: o.omit_block_closer = true, o.eos = true, what = "EOS instead of the closing tag"; break;
    case 6: {
      Invoke& inv = o.invokes[r.Below(o.invokes.size())];
      Param p;
      p.key = "quoted_closer";
      p.value = r.Pick(Strings{"x</｜DSML｜parameter>y", "a </｜DSML｜parameter> b\n",
                                                "</｜DSML｜parameter> is how a value ends"});
      inv.params.insert(inv.params.begin() + static_cast<long>(r.Below(inv.params.size() + 1)), p);
      what = "closing parameter tag inside a value";
      break;
    }
    case 7: o.block_name = "function_calls", o.sep = "\r\n", what = "function_calls with CRLF"; break;
    default: o.sep = "\n\n", o.before_block = "\n", what = "blank lines between tags, one newline before the block"; break;
  }
  o.Render();
  return WellFormed(Shape::Kind::kLenient, "lenient #" + std::to_string(i) + ": " + what, o);
}

Shape BrokenShape(Rng& r, size_t i) {
  Output o = RandomOutput(r, /*plain=*/true, 1, 1);
  const size_t n = o.invokes.size();
  size_t k = r.Below(n);  // the invoke that breaks
  Invoke& inv = o.invokes[k];
  Param& first = inv.params.front();
  std::string what;
  switch (i % 16) {
    case 0: inv.opener_override = "<" + kD + "invoke name=" + inv.name + ">", what = "unquoted tool name"; break;
    case 1: inv.opener_override = "<" + kD + "invoke name=\"\">", what = "empty tool name"; break;
    case 2: {
      const std::string bad = r.Pick(Strings{"yes", "True", "", "1", "false "});
      first.opener_override = "<" + kD + "parameter name=\"" + first.key + "\" string=\"" + bad + "\">";
      what = "string=\"" + bad + "\"";
      break;
    }
    case 3: first.opener_override = "<" + kD + "parameter name=\"" + first.key + "\">", what = "no string attribute"; break;
    case 4:
      first.opener_override = "<" + kD + "parameter string=\"true\" name=\"" + first.key + "\">", what = "attributes swapped";
      break;
    case 5:
      inv.opener_override = "<" + kD + "invoke id=\"1\" name=\"" + inv.name + "\">", what = "attribute before the name";
      break;
    case 6:
      first.opener_override = "<" + kD + "parameter name=\"" + first.key + "\" extra=\"1\" string=\"true\">";
      what = "extra attribute";
      break;
    case 7: first.is_string = false, first.value = r.Pick(kBadJson), what = "string=\"false\" value that is not JSON"; break;
    case 8: inv.params.push_back(first), what = "duplicate parameter"; break;
    case 9:
      k = n - 1, o.invokes[k].params.back().closer_override = "</" + kD + "param>";
      what = "misspelt closing parameter tag";
      break;
    case 10: inv.closer_override = "</" + kD + "invok>", what = "misspelt closing invoke tag"; break;
    case 11: inv.omit_closer = true, what = "missing closing invoke tag"; break;
    case 12:
      // Every invoke completes; the block's end does not parse.
      k = n, o.closer_override = "</" + kD + "function_calls>";
      what = "wrong closing block tag";
      break;
    case 13: {
      const bool before_first = r.Percent(50);
      k = before_first ? 0 : n;
      o.garbage_at = r.Pick(Strings{"hello", "{\"name\": \"x\"}", "<invoke>"});
      o.garbage_index = before_first ? 0 : n;
      what = before_first ? "text before the first invoke" : "text after the last invoke";
      break;
    }
    case 14: {  // cut off (max_tokens) somewhere inside the block
      o.eos = false;
      o.Render();
      const size_t cut = CharStart(o.text, o.opener_end + r.Below(o.block_end - o.opener_end));
      size_t complete = 0;
      while (complete < n && o.invoke_end[complete] <= cut) ++complete;
      o.text.resize(cut);
      return Broken("broken #" + std::to_string(i) + ": cut off at byte " + std::to_string(cut), o, complete);
    }
    default: {  // a call cut off inside unterminated reasoning
      o.thinking = true, o.close_reasoning = false, o.eos = false;
      o.reasoning = r.Pick(Strings{"Let me call it.", "考える", ""});
      o.Render();
      const size_t cut = CharStart(o.text, o.opener_end + r.Below(o.block_end - o.opener_end));
      size_t complete = 0;
      while (complete < n && o.invoke_end[complete] <= cut) ++complete;
      o.text.resize(cut);
      return Broken("broken #" + std::to_string(i) + ": call cut off inside unterminated reasoning", o, complete);
    }
  }
  o.Render();
  return Broken("broken #" + std::to_string(i) + ": " + what + " (calls before it: " + std::to_string(k) + ")", o, k);
}

}  // namespace

const char* KindName(Shape::Kind kind) {
  switch (kind) {
    case Shape::Kind::kOfficial: return "official";
    case Shape::Kind::kLenient: return "lenient";
    case Shape::Kind::kBroken: return "broken";
  }
  return "?";
}

std::vector<Shape> Generate(uint64_t seed, size_t official, size_t lenient, size_t broken) {
  Rng r{seed};
  std::vector<Shape> out;
  for (size_t i = 0; i < official; ++i) out.push_back(OfficialShape(r, i));
  for (size_t i = 0; i < lenient; ++i) out.push_back(LenientShape(r, i));
  for (size_t i = 0; i < broken; ++i) out.push_back(BrokenShape(r, i));
  return out;
}

}  // namespace dsmesh::dsml_shapes

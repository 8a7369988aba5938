#include "common/tokenizer/testing/test_corpus.h"

#include <pcre2.h>

#include <functional>
#include <stdexcept>
#include <utility>

#include "common/tokenizer/utf8.h"

namespace dsmesh::testing {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {  // splitmix64
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return n ? Next() % n : 0; }
  size_t Between(size_t lo, size_t hi) { return lo + Below(hi - lo + 1); }
  bool Chance(double p) { return (Next() >> 11) * (1.0 / 9007199254740992.0) < p; }
  template <class T>
  const T& Pick(const std::vector<T>& v) { return v[Below(v.size())]; }

 private:
  uint64_t s_;
};

std::string Cp(char32_t c) {
  std::string s;
  utf8::AppendCodePoint(c, &s);
  return s;
}

std::string Repeat(const std::string& s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

const std::vector<std::string> kEnglishWords = {
    "the", "of", "and", "to", "in", "is", "was", "that", "for", "it", "with", "as", "on", "be", "at", "by", "this",
    "had", "not", "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were", "her", "all",
    "she", "there", "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "no", "if", "out",
    "so", "said", "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some",
    "could", "time", "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our",
    "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through",
    "back", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those",
    "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men",
    "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day", "same", "another",
    "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against", "go",
    "tokenizer", "inference", "gradient", "transformer", "attention", "quantization", "throughput", "latency",
    "don't", "it's", "they're", "we've", "I'm", "you'll", "he'd", "can't", "won't", "shouldn't", "o'clock",
    "rock'n'roll", "self-contained", "state-of-the-art", "e-mail", "naïve", "café", "résumé", "coöperate",
    "Zürich", "Ångström", "façade", "jalapeño", "São", "Paulo", "Kraków", "Dvořák", "Øresund", "straße"};
const std::vector<std::string> kNames = {"Alice", "Bob", "DeepSeek", "London", "McDonald", "O'Brien", "NASA",
                                         "GPU", "H200", "iPhone", "eBay", "LaTeX", "JSON", "HTTP/2", "C++", "Node.js"};
const std::vector<std::string> kPunct = {".", ",", ";", ":", "!", "?", "...", "—", "–", " -", "!?", "?!", "…"};

std::string EnglishSentence(Rng& r) {
  std::string s;
  const size_t n = r.Between(3, 24);
  for (size_t i = 0; i < n; ++i) {
    if (i) s += r.Chance(0.03) ? "  " : " ";
    std::string w = r.Chance(0.08) ? r.Pick(kNames) : r.Pick(kEnglishWords);
    if (i == 0 && w[0] >= 'a' && w[0] <= 'z') w[0] = char(w[0] - 32);
    if (r.Chance(0.04)) w = "\"" + w + "\"";
    if (r.Chance(0.03)) w = "(" + w + ")";
    if (r.Chance(0.02)) w = "'" + w + "'";
    if (r.Chance(0.02)) w = std::to_string(r.Below(100000));
    if (r.Chance(0.01)) w = "https://example.com/" + w + "?q=" + std::to_string(r.Below(999)) + "&lang=en#top";
    if (r.Chance(0.01)) w = w + "@mail.example.org";
    if (r.Chance(0.01)) for (char& c : w) c = (c >= 'a' && c <= 'z') ? char(c - 32) : c;
    s += w;
    if (i + 1 < n && r.Chance(0.08)) s += r.Pick(std::vector<std::string>{",", ";", ":", " —", "'s"});
  }
  return s + r.Pick(kPunct);
}

std::string English(Rng& r) {
  std::string s;
  const size_t paragraphs = r.Between(1, 4);
  for (size_t p = 0; p < paragraphs; ++p) {
    if (p) s += r.Chance(0.5) ? "\n\n" : "\n";
    const size_t sentences = r.Between(1, 8);
    for (size_t i = 0; i < sentences; ++i) s += (i ? " " : "") + EnglishSentence(r);
  }
  return s;
}

std::string FromRanges(Rng& r, const std::vector<std::pair<char32_t, char32_t>>& ranges) {
  const auto& [lo, hi] = r.Pick(ranges);
  return Cp(char32_t(lo + r.Below(hi - lo + 1)));
}

const std::vector<std::string> kKanji = {"日", "本", "語", "人", "大", "年", "中", "会", "出", "国", "時", "行", "見",
                                         "月", "分", "後", "前", "生", "間", "上", "東", "京", "都", "学", "校", "先",
                                         "話", "電", "車", "食", "飲", "書", "読", "新", "聞", "雨", "雪", "々", "〆"};
const std::vector<std::string> kKatakanaWords = {"コンピューター", "トークナイザー", "データ", "サーバー", "モデル",
                                                 "テスト", "ネットワーク", "プログラム", "ｶﾀｶﾅ", "ﾃﾞｰﾀ", "ヴァイオリン"};

std::string Japanese(Rng& r) {
  std::string s;
  const size_t n = r.Between(5, 120);
  for (size_t i = 0; i < n; ++i) {
    const size_t k = r.Below(10);
    if (k < 4) s += FromRanges(r, {{0x3041, 0x3093}});
    else if (k < 6) s += r.Pick(kKanji);
    else if (k < 7) s += r.Pick(kKatakanaWords);
    else if (k < 8) s += r.Pick(std::vector<std::string>{"。", "、", "「", "」", "！", "？", "・", "ー", "〜", "（", "）", "…"});
    else if (k < 9) s += r.Pick(std::vector<std::string>{"２０２６年", "１２月", "ＡＢＣ", "ｈｔｔｐ", " ", "　", "3月", "100円"});
    else s += FromRanges(r, {{0x30A1, 0x30F6}, {0xFF66, 0xFF9D}});
  }
  return s;
}

const std::vector<std::string> kHanzi = {"的", "一", "是", "不", "了", "在", "人", "有", "我", "他", "这", "个", "们",
                                         "中", "来", "上", "大", "为", "和", "国", "地", "到", "以", "说", "时", "要",
                                         "就", "出", "会", "可", "也", "你", "对", "生", "能", "而", "子", "那", "得",
                                         "模", "型", "推", "理", "深", "度", "求", "索", "龘", "齉", "鿐", "㐀", "㑇",
                                         "𠀀", "𪚥", "𫠝", "丨", "乂", "亍", "兀", "毕", "老", "师", "你好", "世界"};

std::string Chinese(Rng& r) {
  std::string s;
  const size_t n = r.Between(5, 150);
  for (size_t i = 0; i < n; ++i) {
    if (r.Chance(0.12)) s += r.Pick(std::vector<std::string>{"，", "。", "！", "？", "：", "；", "“", "”", "（", "）", "《", "》", "、", "——", "……", " ", "\n"});
    else if (r.Chance(0.03)) s += std::to_string(r.Below(100000));
    else if (r.Chance(0.03)) s += r.Pick(kEnglishWords);
    else s += r.Pick(kHanzi);
  }
  return s;
}

std::string Korean(Rng& r) {
  std::string s;
  const size_t words = r.Between(2, 40);
  for (size_t w = 0; w < words; ++w) {
    if (w) s += r.Chance(0.9) ? " " : "\n";
    const size_t len = r.Between(1, 6);
    for (size_t i = 0; i < len; ++i) s += FromRanges(r, {{0xAC00, 0xD7A3}, {0xAC00, 0xD7A3}, {0xAC00, 0xD7A3}, {0x3131, 0x318E}});
    if (r.Chance(0.1)) s += Cp(0x1100 + char32_t(r.Below(19))) + Cp(0x1161 + char32_t(r.Below(21)));  // conjoining jamo
    if (r.Chance(0.15)) s += r.Pick(std::vector<std::string>{".", ",", "?", "!", "요.", "다.", "(한국어)", "123"});
  }
  return s;
}

std::string Ident(Rng& r) {
  static const std::vector<std::string> parts = {"get", "set", "token", "ids", "buffer", "len", "count", "user", "id",
                                                 "max", "min", "index", "value", "key", "node", "tmp", "x", "i", "j",
                                                 "HTTP", "Json", "parse", "URL", "kMax", "m_", "__init__", "self"};
  std::string s = r.Pick(parts);
  const size_t extra = r.Below(3);
  for (size_t i = 0; i < extra; ++i) {
    std::string p = r.Pick(parts);
    if (r.Chance(0.5)) s += "_" + p;
    else {
      if (p[0] >= 'a' && p[0] <= 'z') p[0] = char(p[0] - 32);
      s += p;
    }
  }
  return s;
}

std::string Code(Rng& r) {
  const std::string a = Ident(r), b = Ident(r), c = Ident(r);
  const std::string n = std::to_string(r.Below(100000));
  const std::string nl = r.Chance(0.2) ? "\r\n" : "\n";
  const std::string ind = r.Chance(0.3) ? "\t" : (r.Chance(0.5) ? "    " : "  ");
  std::vector<std::string> snippets = {
      "#include <vector>" + nl + "int " + a + "(const std::vector<int>& " + b + ") {" + nl + ind + "int " + c +
          " = 0;" + nl + ind + "for (size_t i = 0; i < " + b + ".size(); ++i) " + c + " += " + b + "[i] * " + n +
          ";" + nl + ind + "return " + c + ";  // sum" + nl + "}" + nl,
      "def " + a + "(" + b + ", " + c + "=None):" + nl + ind + "\"\"\"Docstring: " + a + ".\"\"\"" + nl + ind +
          "if " + c + " is None:" + nl + ind + ind + c + " = {'" + b + "': " + n + ", \"x\": [1, 2.5, -3e-4]}" + nl +
          ind + "return [x ** 2 for x in range(" + n + ") if x % 3 == 0]" + nl,
      "const " + a + " = async (" + b + ") => {" + nl + ind + "const { " + c + " } = await fetch(`/api/${" + b +
          "}?n=" + n + "`);" + nl + ind + "return " + c + "?.map((v, i) => v !== null ? v : i) ?? [];" + nl + "};" +
          nl,
      "fn " + a + "<'a>(" + b + ": &'a [u8]) -> Result<Vec<u32>, Box<dyn std::error::Error>> {" + nl + ind +
          "let mut " + c + " = Vec::with_capacity(" + n + ");" + nl + ind + "for &x in " + b + ".iter() { " + c +
          ".push(u32::from(x) << 2); }" + nl + ind + "Ok(" + c + ")" + nl + "}" + nl,
      "func " + a + "(" + b + " []string) (map[string]int, error) {" + nl + ind + c + " := make(map[string]int)" +
          nl + ind + "for _, s := range " + b + " {" + nl + ind + ind + c + "[s]++" + nl + ind + "}" + nl + ind +
          "return " + c + ", nil" + nl + "}" + nl,
      "SELECT u." + a + ", COUNT(*) AS " + b + " FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE u." + c +
          " >= " + n + " GROUP BY 1 ORDER BY 2 DESC;" + nl,
      "#!/bin/bash" + nl + "set -euo pipefail" + nl + "for f in ./*.txt; do grep -c '" + a + "' \"$f\" | awk '{s+=$1} END {print s}'; done 2>&1 | tee /tmp/" + b + ".log" + nl,
      "<div class=\"" + a + "\" id='" + b + "'><p>Hello &amp; welcome, " + c + "!</p><br/></div>" + nl,
      "{\"" + a + "\": " + n + ", \"" + b + "\": [true, false, null], \"" + c + "\": {\"nested\": \"va\\\"lue\\n\"}}" + nl,
      a + ":" + nl + "  - name: " + b + nl + "    value: " + n + nl + "    enabled: yes   " + nl,
      "    " + a + " = " + b + "->" + c + "[" + n + "] ?: 0x" + std::to_string(r.Below(0xFFFF)) + "ULL; /* " + c + " */" + nl,
  };
  std::string s;
  const size_t k = r.Between(1, 4);
  for (size_t i = 0; i < k; ++i) s += r.Pick(snippets);
  return s;
}

const std::vector<std::string> kEmoji = {
    "😀", "😂", "🤣", "❤️", "👍", "👍🏽", "👍🏿", "🙏🏻", "🔥", "✨", "🎉", "🚀", "💯", "🤖", "🧠", "🥹", "🫠",
    "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏾‍🚀", "🏳️‍🌈", "🏴‍☠️", "❤️‍🔥", "👁️‍🗨️", "🇯🇵", "🇺🇸", "🇩🇪", "🇨🇳", "🇰🇷",
    "1️⃣", "#️⃣", "*️⃣", "©️", "™️", "☺", "☺️", "♀️", "🏴󠁧󠁢󠁥󠁮󠁧󠁿", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👋🏼", "🤝", "🫶🏾", "🐈‍⬛"};

std::string Emoji(Rng& r) {
  std::string s;
  const size_t n = r.Between(1, 40);
  for (size_t i = 0; i < n; ++i) {
    if (r.Chance(0.3)) s += r.Pick(kEnglishWords);
    s += r.Pick(kEmoji);
    if (r.Chance(0.3)) s += " ";
    if (r.Chance(0.05)) s += "\u200D";  // stray ZWJ
  }
  return s;
}

std::string Combining(Rng& r) {
  static const std::vector<std::string> fixed = {
      "e\u0301", "a\u0300\u0323", "Ä", "A\u0308", "n\u0303o", "हिन्दी", "नमस्ते दुनिया", "العربية", "مَرْحَبًا بِالْعَالَمِ",
      "שָׁלוֹם", "ภาษาไทย", "สวัสดีครับ", "Tiếng Việt", "Tie\u0302\u0301ng Vie\u0323\u0302t", "தமிழ்", "한", "Ελληνικά",
      "Привет, мир", "ქართული", "Հայերեն", "ኢትዮጵያ", "ᏣᎳᎩ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝐁𝐨𝐥𝐝", "ﬁ", "Å", "Å"};
  std::string s;
  const size_t n = r.Between(1, 30);
  for (size_t i = 0; i < n; ++i) {
    if (r.Chance(0.5)) {
      s += r.Pick(fixed);
    } else {
      s += char('a' + r.Below(26));
      const size_t marks = r.Between(1, r.Chance(0.1) ? 20 : 3);  // sometimes Zalgo
      for (size_t m = 0; m < marks; ++m) s += FromRanges(r, {{0x0300, 0x036F}, {0x1AB0, 0x1ABE}, {0x20D0, 0x20F0}, {0xFE20, 0xFE2F}});
    }
    s += r.Chance(0.7) ? " " : "";
  }
  return s;
}

std::string Numbers(Rng& r) {
  std::string s;
  const size_t n = r.Between(1, 20);
  for (size_t i = 0; i < n; ++i) {
    switch (r.Below(14)) {
      case 0: for (size_t k = r.Between(1, 60); k; --k) s += char('0' + r.Below(10)); break;
      case 1: s += std::to_string(r.Below(1000)) + "," + std::to_string(100 + r.Below(900)) + "," + std::to_string(100 + r.Below(900)); break;
      case 2: s += std::to_string(r.Below(100)) + "." + std::to_string(r.Below(1000000)) + "e-" + std::to_string(r.Below(30)); break;
      case 3: s += "+1 (555) " + std::to_string(100 + r.Below(900)) + "-" + std::to_string(1000 + r.Below(9000)); break;
      case 4: s += "2026-11-" + std::to_string(10 + r.Below(20)) + "T12:34:56.789Z"; break;
      case 5: s += "0x" + std::to_string(r.Next() % 0xFFFFFFFFull); break;
      case 6: s += "٠١٢٣٤٥٦٧٨٩"; break;
      case 7: s += "１２３４５６"; break;
      case 8: s += "x²+y³=z⁴ ½ ¾ ⅓"; break;
      case 9: s += "Ⅻ ⅻ Ⅳ ① ⑳ ⓵"; break;
      case 10: s += "०१२३४५६७८९ ๑๒๓"; break;
      case 11: s += "$" + std::to_string(r.Below(1000000)) + ".99"; break;
      case 12: s += "v" + std::to_string(r.Below(10)) + "." + std::to_string(r.Below(100)) + "." + std::to_string(r.Below(1000)); break;
      default: s += "-" + std::to_string(r.Next()); break;
    }
    s += r.Pick(std::vector<std::string>{" ", ", ", "\n", "", "; ", " + "});
  }
  return s;
}

const std::vector<std::string> kSpaces = {" ", "  ", "\t", "\n", "\r\n", "\r", "\x0B", "\x0C", "\u00A0", "\u3000",
                                          "\u2028", "\u2029", "\uFEFF", "\u0085", "\u200B", "\u2003", "\u202F",
                                          "\u1680", "\u205F", " \n", "\n ", "\t\t", "\r\r\n", "   \n\n"};

std::string Whitespace(Rng& r) {
  std::string s;
  const size_t n = r.Between(1, 40);
  for (size_t i = 0; i < n; ++i) {
    const size_t run = r.Between(1, 6);
    for (size_t k = 0; k < run; ++k) s += r.Pick(kSpaces);
    const size_t w = r.Below(6);
    if (w == 0) s += r.Pick(kEnglishWords);
    else if (w == 1) s += r.Pick(kHanzi);
    else if (w == 2) s += std::to_string(r.Below(10000));
    else if (w == 3) s += r.Pick(kPunct);
    else if (w == 4) s += r.Pick(kEnglishWords) + "   ";  // trailing spaces
  }
  return s;
}

// Added-token strings of DeepSeek V3 and V4 (and near misses that must not match).
const std::vector<std::string> kSpecialStrings = {
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>",
    "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜place▁holder▁no▁0｜>", "<｜place▁holder▁no▁799｜>",
    "<think>", "</think>", "｜DSML｜", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"f\">",
    "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>", "<｜title｜>", "<｜read_url｜>", "<dsml:", "</dsml:",
    "<｜begin▁sys｜>", "<｜end_of_query｜>", "<|place_holder_mm_span_0021|>", "<|place_holder_mm_span_0435|>",
    "<｜image｜>", "<｜box｜>", "<｜/ref｜>", "<｜/table>｜", "<｜table｜>",
    // near misses
    "<|User|>", "<｜User", "User｜>", "<｜user｜>", "<think", "think>", "<｜", "｜>", "▁", "<｜place▁holder▁no▁800｜>",
    "<|place_holder_mm_span_0020|>", "<｜<｜User｜>｜>", "<<think>>", "</think></think>"};

std::string Specials(Rng& r) {
  std::string s;
  const size_t n = r.Between(1, 12);
  for (size_t i = 0; i < n; ++i) {
    const size_t k = r.Below(5);
    if (k == 0) s += r.Pick(kEnglishWords);
    else if (k == 1) s += " ";
    else if (k == 2) s += r.Pick(kSpaces);
    else if (k == 3) s += r.Pick(kHanzi);
    s += r.Pick(kSpecialStrings);
  }
  return s;
}

std::string LongWord(Rng& r) {
  const size_t n = r.Chance(0.1) ? r.Between(5000, 30000) : r.Between(100, 3000);
  switch (r.Below(12)) {
    case 0: return Repeat("a", n);
    case 1: { std::string s; for (size_t i = 0; i < n; ++i) s += char('a' + r.Below(26)); return s; }
    case 2: { static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
              std::string s; for (size_t i = 0; i < n; ++i) s += b64[r.Below(64)]; return s + "=="; }
    case 3: { std::string s; for (size_t i = 0; i < n; ++i) s += char('0' + r.Below(10)); return s; }
    case 4: return Repeat(" ", n) + "x";
    case 5: return Repeat(r.Pick(kHanzi), n / 3);
    case 6: return Repeat("!", n / 2) + Repeat("-", n / 2);
    case 7: return Repeat("😂", n / 4);
    case 8: { std::string s = "e"; for (size_t i = 0; i < n / 2; ++i) s += "\u0301"; return s; }
    case 9: return Repeat("\n", n / 2) + Repeat("\r\n", n / 4);
    case 10: return "https://example.com/" + Repeat("path/", n / 5) + "?x=1";
    default: return Repeat("ab", n / 2);
  }
}

// Random scalar values. PCRE2 here carries the Unicode 14 tables while the reference (Node's ICU)
// is newer, so code points assigned after Unicode 14 would be classified differently by the two
// engines (Cn vs their real category): we keep code points PCRE2 knows as assigned, plus unassigned
// ones only from planes 4..13, which no Unicode version has assigned.
class UnassignedTest {
 public:
  UnassignedTest() {
    int err;
    PCRE2_SIZE off;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("^\\p{Cn}"), PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, nullptr);
    if (!code_) throw std::runtime_error("test_corpus: cannot compile \\p{Cn}");
    md_ = pcre2_match_data_create(1, nullptr);
  }
  ~UnassignedTest() {
    pcre2_match_data_free(md_);
    pcre2_code_free(code_);
  }
  bool operator()(char32_t c) {
    const std::string s = Cp(c);
    return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md_, nullptr) >= 0;
  }

 private:
  pcre2_code* code_;
  pcre2_match_data* md_;
};

std::string RandomUnicode(Rng& r, UnassignedTest& unassigned) {
  std::string s;
  const size_t n = r.Between(1, 200);
  for (size_t i = 0; i < n;) {
    char32_t c;
    const size_t k = r.Below(4);
    if (k < 2) c = char32_t(r.Below(0x10000));
    else if (k == 2) c = char32_t(0x10000 + r.Below(0x10000));
    else c = char32_t(r.Below(0x110000));
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const int plane = int(c >> 16);
    if (unassigned(c) && (plane < 4 || plane > 13)) continue;
    s += Cp(c);
    ++i;
  }
  return s;
}

std::string Fuzz(Rng& r) {
  static const std::vector<std::string> pool = {
      "a", "Z", "q", "I", "s", "t", "re", "ve", "m", "ll", "d", "0", "7", "42", "'", "\"", "`", ".", ",", "!", "?",
      "-", "_", "(", ")", "[", "]", "{", "}", "<", ">", "|", "/", "\\", "@", "#", "$", "%", "^", "&", "*", "+", "=",
      "~", ":", ";", " ", " ", " ", "  ", "\t", "\n", "\r", "\r\n", "\u00A0", "\u3000", "\uFEFF", "\u0085",
      "\u2028", "中", "文", "龥", "龦", "ぁ", "ゟ", "゠", "ヿ", "ー", "한", "ㄱ", "\u0301", "\u0308", "é", "ß", "Ω",
      "я", "ע", "ب", "ก", "\u0E31", "😀", "\u200D", "\uFE0F", "🏽", "🇯", "１", "２", "²", "½", "Ⅻ", "٣", "｜", "▁",
      "<｜", "｜>", "<｜User｜>", "<think>", "</think>", "\u00AD", "\u200B", "\u2060", "\x01", "\x7F", "©", "™",
      "€", "£", "¥", "§", "¶", "•", "→", "∑", "√", "∞", "≠", "♪", "☃", "…"};
  std::string s;
  const size_t n = r.Between(1, 120);
  for (size_t i = 0; i < n; ++i) s += r.Pick(pool);
  return s;
}

}  // namespace

size_t TotalBytes(const std::vector<CorpusItem>& items) {
  size_t n = 0;
  for (const CorpusItem& it : items) n += it.text.size();
  return n;
}

std::vector<CorpusItem> GenerateTokenizerCorpus(size_t min_bytes, uint64_t seed) {
  Rng r(seed);
  UnassignedTest unassigned;
  struct Category {
    const char* name;
    double share;  // of min_bytes
    std::function<std::string()> make;
  };
  const std::vector<Category> categories = {
      {"english", 0.17, [&] { return English(r); }},
      {"japanese", 0.06, [&] { return Japanese(r); }},
      {"chinese", 0.06, [&] { return Chinese(r); }},
      {"korean", 0.05, [&] { return Korean(r); }},
      {"code", 0.14, [&] { return Code(r); }},
      {"emoji", 0.05, [&] { return Emoji(r); }},
      {"combining", 0.05, [&] { return Combining(r); }},
      {"numbers", 0.05, [&] { return Numbers(r); }},
      {"whitespace", 0.05, [&] { return Whitespace(r); }},
      {"special_tokens", 0.05, [&] { return Specials(r); }},
      {"long_words", 0.12, [&] { return LongWord(r); }},
      {"random_unicode", 0.07, [&] { return RandomUnicode(r, unassigned); }},
      {"fuzz", 0.08, [&] { return Fuzz(r); }},
  };
  std::vector<CorpusItem> items;
  for (const Category& c : categories) {
    const size_t target = size_t(c.share * double(min_bytes)) + 1;
    for (size_t bytes = 0; bytes < target;) {
      std::string text = c.make();
      bytes += text.size();
      items.push_back({c.name, std::move(text)});
    }
  }
  // Top up with English if the shares (rounded) fell short.
  while (TotalBytes(items) < min_bytes) items.push_back({"english", English(r)});
  for (const CorpusItem& it : items)
    if (utf8::FindInvalid(it.text) != utf8::kValid) throw std::logic_error("test_corpus produced invalid UTF-8 in " + it.category);
  return items;
}

}  // namespace dsmesh::testing

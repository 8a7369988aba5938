#include "common/tokenizer/tokenizer_json.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace dsmesh {

const char kGpt2SplitRegex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

namespace {

using nlohmann::json;

[[noreturn]] void Fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) Fail(path, "cannot open file");
  std::string text(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  if (!in.read(text.data(), std::streamsize(text.size()))) Fail(path, "cannot read file");
  return text;
}

json ParseJson(const std::string& path) {
  try {
    return json::parse(ReadFile(path));
  } catch (const json::exception& e) {
    Fail(path, std::string("invalid JSON: ") + e.what());
  }
}

// Streams tokenizer.json: model.vocab and model.merges (99% of the file) go straight into the spec;
// everything else is built as a small DOM. A full nlohmann DOM of the file takes ~1 s to build.
class TokenizerJsonSax : public nlohmann::json_sax<json> {
 public:
  explicit TokenizerJsonSax(TokenizerSpec* spec) : spec_(spec) {}
  json& root() { return root_; }

  bool null() override { return Value(json()); }
  bool boolean(bool v) override { return Value(json(v)); }
  bool number_integer(number_integer_t v) override { return Integer(int64_t(v)) || Value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Integer(int64_t(v)) || Value(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return Value(json(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      const size_t space = v.find(' ');
      if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos)
        throw std::runtime_error("model.merges entry '" + v + "' is not 'left right'");
      spec_->merges.emplace_back(v.substr(0, space), v.substr(space + 1));
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    if (mode_ == Mode::kVocab) throw std::runtime_error("model.vocab['" + key_ + "'] is not an integer id");
    return Value(json(std::move(v)));
  }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override {
    if (mode_ != Mode::kDom) throw std::runtime_error("unexpected object inside model.vocab / model.merges");
    if (AtModelField("vocab")) {
      mode_ = Mode::kVocab;
      saw_vocab_ = true;
      spec_->vocab.reserve(1 << 17);  // the element count is not known up front
      return true;
    }
    return Open(json::object());
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return Close();
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kDom) throw std::runtime_error("unexpected array inside model.vocab / model.merges");
    if (AtModelField("merges")) {
      mode_ = Mode::kMerges;
      saw_merges_ = true;
      spec_->merges.reserve(1 << 17);
      return true;
    }
    return Open(json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2) throw std::runtime_error("model.merges entry is not a pair ['left', 'right']");
      spec_->merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    return Close();
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::kDom) keys_.back() = k;
    key_ = std::move(k);  // the lexer's buffer may be moved from
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    throw std::runtime_error(std::string("invalid JSON at byte ") + std::to_string(position) + ": " + e.what());
  }
  bool saw_vocab() const { return saw_vocab_; }
  bool saw_merges() const { return saw_merges_; }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool AtModelField(const char* field) const {
    return stack_.size() == 2 && keys_[0] == "model" && keys_[1] == field;
  }
  bool Integer(int64_t v) {
    if (mode_ != Mode::kVocab) return false;
    if (v < INT32_MIN || v > INT32_MAX) throw std::runtime_error("model.vocab['" + key_ + "'] id out of range");
    spec_->vocab.emplace_back(std::move(key_), int32_t(v));
    return true;
  }
  // Inserts a value into the current container; returns it.
  json* Insert(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[keys_.back()];
    slot = std::move(v);
    return &slot;
  }
  bool Value(json&& v) {
    if (mode_ != Mode::kDom) throw std::runtime_error("unexpected value inside model.vocab / model.merges");
    Insert(std::move(v));
    return true;
  }
  bool Open(json&& v) {
    stack_.push_back(Insert(std::move(v)));
    keys_.emplace_back();
    return true;
  }
  bool Close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  TokenizerSpec* spec_;
  json root_;
  std::vector<json*> stack_;
  std::vector<std::string> keys_;  // last key seen in each open object
  std::string key_;
  std::vector<std::string> pair_;
  Mode mode_ = Mode::kDom;
  bool saw_vocab_ = false, saw_merges_ = false;
};

bool IsNull(const json& j, const char* key) { return !j.contains(key) || j.at(key).is_null(); }

bool BoolOr(const json& j, const char* key, bool fallback) {
  return IsNull(j, key) ? fallback : j.at(key).get<bool>();
}

void ReadPreTokenizer(const std::string& path, const json& pt, TokenizerSpec* spec) {
  if (pt.is_null()) return;
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const json& step : pt.at("pretokenizers")) ReadPreTokenizer(path, step, spec);
  } else if (type == "Split") {
    const json& pattern = pt.at("pattern");
    if (!pattern.contains("Regex")) Fail(path, "pre_tokenizer Split: only Regex patterns are supported");
    if (pt.value("behavior", "") != "Isolated")
      Fail(path, "pre_tokenizer Split: unsupported behavior '" + pt.value("behavior", "") + "' (only Isolated)");
    if (BoolOr(pt, "invert", false)) Fail(path, "pre_tokenizer Split: invert = true is not supported");
    spec->pre_tokenizer.push_back({PreTokenizerStep::Kind::kSplitIsolated, pattern.at("Regex").get<std::string>()});
  } else if (type == "ByteLevel") {
    if (BoolOr(pt, "add_prefix_space", false))
      spec->pre_tokenizer.push_back({PreTokenizerStep::Kind::kPrefixSpace, ""});
    if (BoolOr(pt, "use_regex", true))
      spec->pre_tokenizer.push_back({PreTokenizerStep::Kind::kSplitIsolated, kGpt2SplitRegex});
  } else {
    Fail(path, "unsupported pre_tokenizer type '" + type + "' (byte-level BPE family only)");
  }
}

bool HasByteLevelPreTokenizer(const json& pt) {
  if (pt.is_null()) return false;
  if (pt.value("type", "") == "ByteLevel") return true;
  if (pt.value("type", "") == "Sequence")
    for (const json& step : pt.at("pretokenizers"))
      if (HasByteLevelPreTokenizer(step)) return true;
  return false;
}

std::optional<std::string> TokenContent(const json& config, const char* key) {
  if (IsNull(config, key)) return std::nullopt;
  const json& t = config.at(key);
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content")) return t.at("content").get<std::string>();
  return std::nullopt;
}

void ReadModel(const std::string& path, const json& model, TokenizerSpec* spec) {
  if (model.value("type", "") != "BPE") Fail(path, "model.type must be BPE, got '" + model.value("type", "") + "'");
  if (!IsNull(model, "dropout") && model.at("dropout").get<double>() != 0.0) Fail(path, "model.dropout is not supported");
  if (BoolOr(model, "byte_fallback", false)) Fail(path, "model.byte_fallback is not supported (byte-level BPE has no unknowns)");
  if (!IsNull(model, "continuing_subword_prefix")) Fail(path, "model.continuing_subword_prefix is not supported");
  if (!IsNull(model, "end_of_word_suffix")) Fail(path, "model.end_of_word_suffix is not supported");
  spec->ignore_merges = BoolOr(model, "ignore_merges", false);
}

}  // namespace

TokenizerSpec ReadTokenizerSpec(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  const fs::path input(dir_or_file);
  const fs::path json_path = fs::is_directory(input) ? input / "tokenizer.json" : input;
  const fs::path config_path = json_path.parent_path() / "tokenizer_config.json";
  TokenizerSpec spec;
  spec.path = json_path.string();
  if (!fs::exists(json_path)) Fail(spec.path, "no such file (expected a tokenizer.json or a directory holding one)");

  json root;
  try {
    const std::string text = ReadFile(spec.path);
    TokenizerJsonSax sax(&spec);
    json::sax_parse(text, &sax);
    root = std::move(sax.root());
    if (!sax.saw_vocab() || !sax.saw_merges()) Fail(spec.path, "model.vocab and model.merges are required");
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind(spec.path, 0) == 0) throw;
    Fail(spec.path, e.what());
  }
  try {
    if (!root.is_object() || !root.contains("model")) Fail(spec.path, "not a tokenizer.json (no 'model')");
    const json& norm = root.contains("normalizer") ? root.at("normalizer") : json();
    if (!norm.is_null() && !(norm.value("type", "") == "Sequence" && norm.at("normalizers").empty()))
      Fail(spec.path, "unsupported normalizer " + norm.dump().substr(0, 200) + " (only none)");
    const json& pt = root.contains("pre_tokenizer") ? root.at("pre_tokenizer") : json();
    if (!HasByteLevelPreTokenizer(pt)) Fail(spec.path, "pre_tokenizer has no ByteLevel step: not a byte-level BPE tokenizer");
    ReadPreTokenizer(spec.path, pt, &spec);
    const json& dec = root.contains("decoder") ? root.at("decoder") : json();
    if (dec.is_null() || dec.value("type", "") != "ByteLevel")
      Fail(spec.path, "decoder must be ByteLevel, got " + dec.dump().substr(0, 200));
    const json& post = root.contains("post_processor") ? root.at("post_processor") : json();
    if (!post.is_null() && post.value("type", "") != "ByteLevel")
      Fail(spec.path, "unsupported post_processor type '" + post.value("type", "") + "' (only ByteLevel or none)");
    ReadModel(spec.path, root.at("model"), &spec);
    if (root.contains("added_tokens") && !root.at("added_tokens").is_null()) {
      for (const json& t : root.at("added_tokens")) {
        AddedTokenSpec a;
        a.id = t.at("id").get<int32_t>();
        a.content = t.at("content").get<std::string>();
        a.special = BoolOr(t, "special", false);
        a.lstrip = BoolOr(t, "lstrip", false);
        a.rstrip = BoolOr(t, "rstrip", false);
        a.single_word = BoolOr(t, "single_word", false);
        a.normalized = BoolOr(t, "normalized", !a.special);
        if (a.content.empty()) Fail(spec.path, "added token id " + std::to_string(a.id) + " has empty content");
        spec.added_tokens.push_back(std::move(a));
      }
    }
  } catch (const json::exception& e) {
    Fail(spec.path, std::string("unexpected structure: ") + e.what());
  }

  if (fs::exists(config_path)) {
    const std::string cpath = config_path.string();
    const json config = ParseJson(cpath);
    try {
      spec.bos_token = TokenContent(config, "bos_token");
      spec.eos_token = TokenContent(config, "eos_token");
      spec.add_bos_token = BoolOr(config, "add_bos_token", false);
      spec.add_eos_token = BoolOr(config, "add_eos_token", false);
      spec.clean_up_tokenization_spaces = BoolOr(config, "clean_up_tokenization_spaces", false);
    } catch (const json::exception& e) {
      Fail(cpath, std::string("unexpected structure: ") + e.what());
    }
  }
  return spec;
}

}  // namespace dsmesh

#include "common/tokenizer/tokenizer_json.h"

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
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(path, "cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json ParseJson(const std::string& path) {
  try {
    return json::parse(ReadFile(path));
  } catch (const json::exception& e) {
    Fail(path, std::string("invalid JSON: ") + e.what());
  }
}

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
  const json& vocab = model.at("vocab");
  if (!vocab.is_object()) Fail(path, "model.vocab must be an object");
  spec->vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) Fail(path, "model.vocab['" + it.key() + "'] is not an integer id");
    spec->vocab.emplace_back(it.key(), it.value().get<int32_t>());
  }
  const json& merges = model.at("merges");
  spec->merges.reserve(merges.size());
  for (const json& m : merges) {
    if (m.is_string()) {  // "left right" (tokenizers < 0.20)
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        Fail(path, "model.merges entry '" + s + "' is not 'left right'");
      spec->merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2) {  // ["left", "right"]
      spec->merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      Fail(path, "model.merges entry " + m.dump() + " is neither 'a b' nor ['a', 'b']");
    }
  }
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

  const json root = ParseJson(spec.path);
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

// Reads a Hugging Face tokenizer.json (and the tokenizer_config.json beside it, if any) into plain
// data. Only the byte-level BPE family is accepted (DeepSeek V3/V4, GPT-2 style): anything else is
// rejected with an error that names the file and the field, instead of being tokenized wrongly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dsmesh {

struct AddedTokenSpec {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// One pre-tokenization step, applied in order to every piece the previous step produced.
struct PreTokenizerStep {
  enum class Kind { kSplitIsolated, kPrefixSpace };
  Kind kind;
  std::string regex;  // kSplitIsolated: the pattern as written in tokenizer.json
};

struct TokenizerSpec {
  std::string path;  // tokenizer.json, for error messages
  std::vector<std::pair<std::string, int32_t>> vocab;        // ByteLevel spelling -> id
  std::vector<std::pair<std::string, std::string>> merges;   // in rank order
  bool ignore_merges = false;
  std::vector<AddedTokenSpec> added_tokens;
  std::vector<PreTokenizerStep> pre_tokenizer;
  // From tokenizer_config.json (absent file: no BOS/EOS, nothing added, no clean-up).
  std::optional<std::string> bos_token, eos_token;
  bool add_bos_token = false;
  bool add_eos_token = false;
  bool clean_up_tokenization_spaces = false;
};

// `dir_or_file` is a directory holding tokenizer.json, or the path of the tokenizer.json itself.
TokenizerSpec ReadTokenizerSpec(const std::string& dir_or_file);

// The pre-tokenization regex of GPT-2, used by a ByteLevel pre-tokenizer with use_regex = true.
extern const char kGpt2SplitRegex[];

}  // namespace dsmesh

// Hugging Face tokenizer.json loader and codec for the byte-level BPE family (DeepSeek V3/V4):
// added tokens are matched first, then the regex pre-tokenizer splits the rest, then BPE merges by
// rank; decoding maps token bytes back and repairs invalid UTF-8 with U+FFFD. Token ids match the
// reference implementation @lenml/tokenizers exactly (see tokenizer_parity_test).
//
// A Tokenizer is immutable after Load and safe to use from many threads at once (per-thread caches
// live in thread-local storage).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/string_id_table.h"

namespace dsmesh {

// Thrown by Encode for text that is not well-formed UTF-8; the message gives the byte offset.
struct InvalidUtf8Error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class AddedTokenMatcher;
class PreTokenizer;
class BpeModel;
struct TokenizerSpec;

class Tokenizer {
 public:
  // `dir_or_tokenizer_json`: a directory with tokenizer.json (and optionally tokenizer_config.json,
  // which supplies BOS/EOS and add_bos_token/add_eos_token), or the tokenizer.json path itself.
  // Throws std::runtime_error naming the file and the problem.
  static std::shared_ptr<const Tokenizer> Load(const std::string& dir_or_tokenizer_json);

  ~Tokenizer();

  // Token ids of `text`. Added-token strings inside the text (e.g. "<｜User｜>") are always
  // recognized; add_special_tokens adds BOS/EOS as tokenizer_config.json's add_bos_token /
  // add_eos_token ask. Throws InvalidUtf8Error on malformed UTF-8.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = false) const;

  // Text of `ids`; invalid UTF-8 produced by odd id sequences becomes U+FFFD. Throws
  // std::out_of_range naming the id if an id is not in the vocabulary.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token as spelled in tokenizer.json (ByteLevel alphabet for vocabulary tokens, e.g. "Ġthe").
  std::string IdToToken(int32_t id) const;

  // One past the largest id (ids inside may be unused only if tokenizer.json leaves holes).
  int32_t vocab_size() const { return static_cast<int32_t>(token_flags_.size()); }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  bool IsSpecial(int32_t id) const;
  bool IsAdded(int32_t id) const;

  // The bytes id stands for (raw UTF-8 content for added tokens); throws std::out_of_range.
  std::string_view TokenBytes(int32_t id) const;
  // Whether the pre-tokenizer regexes run JIT-compiled (false means PCRE2 could not JIT here).
  bool regex_jit() const;
  // Where this tokenizer was loaded from.
  const std::string& path() const { return path_; }

 private:
  Tokenizer() = default;
  void Build(TokenizerSpec& spec);
  void CheckId(int32_t id) const;
  struct ThreadScratch;
  ThreadScratch& Scratch() const;

  enum Flag : uint8_t { kDefined = 1, kAdded = 2, kSpecial = 4 };
  std::string path_;
  uint64_t serial_ = 0;  // identifies this instance in thread-local caches
  std::vector<uint8_t> token_flags_;
  std::vector<uint32_t> bytes_offset_;  // TokenBytes(id) = bytes_blob_[offset[id], offset[id + 1])
  std::string bytes_blob_;
  std::vector<uint32_t> spelling_offset_;  // IdToToken(id) = spelling_blob_[offset[id], offset[id + 1])
  std::string spelling_blob_;
  StringIdTable token_to_id_;
  std::unique_ptr<AddedTokenMatcher> added_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> bpe_;
  std::optional<int32_t> bos_id_, eos_id_;
  bool add_bos_ = false, add_eos_ = false, clean_up_spaces_ = false;
};

}  // namespace dsmesh

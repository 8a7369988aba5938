// Streaming detokenization: ids arrive one at a time and only text that can no longer change is
// emitted. A character split across tokens is held until complete (or until it proves invalid, then
// it becomes U+FFFD exactly as Tokenizer::Decode would write it), and text that might be the start of
// a stop string is held until it is known not to be one. Concatenating everything Push and Flush
// return gives Tokenizer::Decode(all ids) up to the first stop string.
//
// Tokenizer clean_up_tokenization_spaces (off for DeepSeek) is not applied here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace dsmesh {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, std::vector<std::string> stop_strings = {},
                         bool skip_special_tokens = false);

  // Newly final text (maybe empty). After a stop string was hit, returns "" and ignores the id.
  // Throws std::out_of_range for an id outside the vocabulary.
  std::string Push(int32_t id);

  // A stop string was hit; the text before it has been emitted, the stop string itself never is.
  bool stopped() const { return stopped_; }
  // Which stop string was hit (empty unless stopped()).
  const std::string& matched_stop() const { return matched_stop_; }

  // End of stream: emits what is still held (an unfinished character becomes U+FFFD; a held
  // stop-string prefix is plain text after all). Returns "" if stopped.
  std::string Flush();

 private:
  // Moves decoded text into the stop-string check and returns what may be emitted now.
  std::string Release(bool final);

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::vector<std::string> stop_strings_;
  bool skip_special_tokens_;
  std::string pending_bytes_;  // an incomplete UTF-8 sequence from vocabulary tokens
  std::string held_text_;      // decoded text not yet emitted (may start a stop string)
  bool stopped_ = false;
  std::string matched_stop_;
};

}  // namespace dsmesh

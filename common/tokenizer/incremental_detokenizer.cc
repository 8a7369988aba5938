#include "common/tokenizer/incremental_detokenizer.h"

#include <algorithm>

#include "common/tokenizer/utf8.h"

namespace dsmesh {

IncrementalDetokenizer::IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer,
                                               std::vector<std::string> stop_strings, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {
  for (std::string& s : stop_strings)
    if (!s.empty()) stop_strings_.push_back(std::move(s));  // an empty stop string would stop at once
}

std::string IncrementalDetokenizer::Push(int32_t id) {
  if (stopped_) return "";
  const std::string_view bytes = tokenizer_->TokenBytes(id);  // validates the id
  if (skip_special_tokens_ && tokenizer_->IsSpecial(id)) return "";
  if (tokenizer_->IsAdded(id)) {
    // Added tokens are text of their own: an unfinished character before one is final (U+FFFD).
    if (!pending_bytes_.empty()) utf8::AppendLossy(pending_bytes_, &held_text_);
    pending_bytes_.clear();
    held_text_.append(bytes);
  } else {
    pending_bytes_.append(bytes);
    const size_t done = utf8::AppendLossyComplete(pending_bytes_, &held_text_);
    pending_bytes_.erase(0, done);
  }
  return Release(false);
}

std::string IncrementalDetokenizer::Flush() {
  if (stopped_) return "";
  if (!pending_bytes_.empty()) utf8::AppendLossy(pending_bytes_, &held_text_);
  pending_bytes_.clear();
  return Release(true);
}

std::string IncrementalDetokenizer::Release(bool final) {
  // Earliest occurrence of any stop string (the longest one on a tie at the same position).
  size_t stop_at = std::string::npos;
  for (const std::string& s : stop_strings_) {
    const size_t at = held_text_.find(s);
    if (at != std::string::npos && (at < stop_at || (at == stop_at && s.size() > matched_stop_.size()))) {
      stop_at = at;
      matched_stop_ = s;
    }
  }
  std::string out;
  if (stop_at != std::string::npos) {
    stopped_ = true;
    out = held_text_.substr(0, stop_at);
    held_text_.clear();
    return out;
  }
  matched_stop_.clear();
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  if (!final) {
    for (const std::string& s : stop_strings_) {
      const size_t max_len = std::min(s.size() - 1, held_text_.size());
      for (size_t len = max_len; len > keep; --len)
        if (held_text_.compare(held_text_.size() - len, len, s, 0, len) == 0) {
          keep = len;
          break;
        }
    }
  }
  out = held_text_.substr(0, held_text_.size() - keep);
  held_text_.erase(0, held_text_.size() - keep);
  return out;
}

}  // namespace dsmesh

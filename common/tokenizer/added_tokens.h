// Finds added tokens (specials such as <｜User｜>, <think>) in raw text before pre-tokenization, as
// Hugging Face and the JS reference do: scanning left to right, the longest token starting at the
// first position where any token starts wins. lstrip / rstrip make a token swallow the whitespace on
// that side; single_word keeps a token from matching inside a word. ("normalized" needs no handling:
// the tokenizers this class serves have no normalizer.)
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer_json.h"

namespace dsmesh {

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<AddedTokenSpec>& tokens);

  struct Section {
    std::string_view text;
    int32_t token_id;  // the added token's id, or -1 for plain text to be pre-tokenized
  };

  // Splits `text` into plain sections and added tokens, in order; plain sections are never empty.
  void Split(std::string_view text, std::vector<Section>* out) const;

 private:
  struct Node {
    int32_t token = -1;       // index into tokens_ of the token ending here, or -1
    uint32_t edges_begin = 0;  // children: edges_[edges_begin, edges_end), sorted by byte
    uint32_t edges_end = 0;
  };
  struct Edge {
    unsigned char byte;
    int32_t child;
  };
  struct TokenInfo {
    int32_t id;
    uint32_t length;
    bool lstrip, rstrip, single_word;
  };

  int32_t Child(int32_t node, unsigned char b) const;
  bool SingleWordOk(std::string_view text, size_t begin, size_t end) const;

  std::vector<TokenInfo> tokens_;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<Edge> edges_;
  int32_t root_child_[256];
  bool any_strip_ = false;
};

}  // namespace dsmesh

#include "common/tokenizer/added_tokens.h"

#include <algorithm>
#include <map>
#include <memory>

#include "common/tokenizer/unicode_class.h"
#include "common/tokenizer/utf8.h"

namespace dsmesh {
namespace {

// Last code point of well-formed UTF-8 text ending at `end`.
char32_t LastCodePoint(std::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  return utf8::DecodeValid(text, &begin);
}

std::string_view TrimJsWhitespaceEnd(std::string_view s) {
  while (!s.empty()) {
    const char32_t cp = LastCodePoint(s, s.size());
    if (!unicode_class::IsJsWhitespace(cp)) break;
    std::string tmp;
    utf8::AppendCodePoint(cp, &tmp);
    s.remove_suffix(tmp.size());
  }
  return s;
}

std::string_view TrimJsWhitespaceStart(std::string_view s) {
  while (!s.empty()) {
    size_t pos = 0;
    const char32_t cp = utf8::DecodeValid(s, &pos);
    if (!unicode_class::IsJsWhitespace(cp)) break;
    s.remove_prefix(pos);
  }
  return s;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedTokenSpec>& tokens) {
  // Build a pointer trie, then flatten it into sorted edge arrays for cache-friendly lookups.
  struct BuildNode {
    int32_t token = -1;
    std::map<unsigned char, std::unique_ptr<BuildNode>> children;
  };
  BuildNode root;
  for (const AddedTokenSpec& t : tokens) {
    BuildNode* node = &root;
    for (unsigned char b : t.content) {
      auto& child = node->children[b];
      if (!child) child = std::make_unique<BuildNode>();
      node = child.get();
    }
    // A later duplicate of the same content wins, like the reference's Map(content -> token).
    node->token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back({t.id, static_cast<uint32_t>(t.content.size()), t.lstrip, t.rstrip, t.single_word});
    any_strip_ |= t.lstrip || t.rstrip;
  }
  // Breadth-first flattening so that a node's children are contiguous.
  std::vector<const BuildNode*> order{&root};
  nodes_.push_back({root.token, 0, 0});
  for (size_t i = 0; i < order.size(); ++i) {
    const BuildNode* b = order[i];
    nodes_[i].edges_begin = static_cast<uint32_t>(edges_.size());
    for (const auto& [byte, child] : b->children) {
      edges_.push_back({byte, static_cast<int32_t>(order.size())});
      order.push_back(child.get());
      nodes_.push_back({child->token, 0, 0});
    }
    nodes_[i].edges_end = static_cast<uint32_t>(edges_.size());
  }
  std::fill(std::begin(root_child_), std::end(root_child_), -1);
  for (uint32_t e = nodes_[0].edges_begin; e < nodes_[0].edges_end; ++e) root_child_[edges_[e].byte] = edges_[e].child;
}

int32_t AddedTokenMatcher::Child(int32_t node, unsigned char b) const {
  const Node& n = nodes_[node];
  for (uint32_t e = n.edges_begin; e < n.edges_end; ++e) {
    if (edges_[e].byte == b) return edges_[e].child;
    if (edges_[e].byte > b) break;
  }
  return -1;
}

bool AddedTokenMatcher::SingleWordOk(std::string_view text, size_t begin, size_t end) const {
  if (begin > 0 && unicode_class::IsWordChar(LastCodePoint(text, begin))) return false;
  if (end < text.size()) {
    size_t pos = end;
    if (unicode_class::IsWordChar(utf8::DecodeValid(text, &pos))) return false;
  }
  return true;
}

void AddedTokenMatcher::Split(std::string_view text, std::vector<Section>* out) const {
  out->clear();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t start = 0, i = 0;
  while (i < n) {
    int32_t node = root_child_[s[i]];
    if (node < 0) {
      ++i;
      continue;
    }
    int32_t match = -1;
    size_t match_end = 0;
    for (size_t j = i + 1;; ++j) {
      if (nodes_[node].token >= 0) {
        match = nodes_[node].token;
        match_end = j;
      }
      if (j >= n) break;
      node = Child(node, s[j]);
      if (node < 0) break;
    }
    if (match < 0) {
      ++i;
      continue;
    }
    if (tokens_[match].single_word && !SingleWordOk(text, i, match_end)) {
      i = match_end;  // like HF: the discarded match's text stays plain, scanning resumes after it
      continue;
    }
    if (i > start) out->push_back({text.substr(start, i - start), -1});
    out->push_back({text.substr(i, match_end - i), match});
    i = start = match_end;
  }
  if (start < n) out->push_back({text.substr(start), -1});

  // lstrip / rstrip trim the neighbouring plain text (JavaScript whitespace, as the reference does).
  if (any_strip_) {
    for (size_t k = 0; k < out->size(); ++k) {
      const int32_t t = (*out)[k].token_id;
      if (t < 0) continue;
      if (tokens_[t].lstrip && k > 0 && (*out)[k - 1].token_id < 0)
        (*out)[k - 1].text = TrimJsWhitespaceEnd((*out)[k - 1].text);
      if (tokens_[t].rstrip && k + 1 < out->size() && (*out)[k + 1].token_id < 0)
        (*out)[k + 1].text = TrimJsWhitespaceStart((*out)[k + 1].text);
    }
    out->erase(std::remove_if(out->begin(), out->end(),
                              [](const Section& sec) { return sec.token_id < 0 && sec.text.empty(); }),
               out->end());
  }
  for (Section& sec : *out)
    if (sec.token_id >= 0) sec.token_id = tokens_[sec.token_id].id;
}

}  // namespace dsmesh

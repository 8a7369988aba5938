// Token masks for constrained decoding. A CompiledGrammar determinizes a spec's byte NFA lazily (DFA
// state = set of NFA states, transitions computed on first use) and computes, per DFA state, the set of
// vocabulary tokens whose bytes keep the text inside the language: a walk of the vocabulary's byte trie
// that prunes every subtree the DFA rejects. Masks are cached per DFA state (a bitset over the vocabulary),
// so a step of a sequence costs one lookup once its state was seen. EOS is allowed exactly in accepting
// states. Near the end of the token budget the mask keeps only tokens after which the text can still be
// completed in the tokens left (shortest completion counted in bytes, each byte being one token at worst),
// so even a random model ends with a complete value. Not thread-safe: one executor thread uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/structured/nfa.h"
#include "common/tokenizer/tokenizer.h"

namespace dsmesh::structured {

// The byte trie of a vocabulary. Special tokens (BOS/EOS) are never in it; added non-special tokens
// (<think>, ｜DSML｜, ...) are in the `with_added` trie only.
class VocabTrie {
 public:
  VocabTrie(const Tokenizer& tokenizer, int64_t vocab_size, bool with_added);
  int64_t vocab_size() const { return vocab_size_; }
  int32_t eos() const { return eos_; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

  // Flattened nodes: children of n are child_node_[first_[n] .. first_[n + 1]) with bytes child_byte_.
  std::vector<uint32_t> first_;
  std::vector<uint32_t> child_node_;
  std::vector<uint8_t> child_byte_;
  std::vector<int32_t> node_token_;  // first token ending at the node, -1 if none
  std::vector<int32_t> next_same_;   // further tokens with the same bytes

 private:
  int64_t vocab_size_;
  int32_t eos_ = -1;
  std::vector<std::string> bytes_;
};

class CompiledGrammar {
 public:
  CompiledGrammar(Nfa nfa, std::shared_ptr<const VocabTrie> trie);

  int32_t start() const { return 0; }
  // State after one byte / a token's bytes; -1 when the language rejects it. EOS leaves the state as is.
  int32_t Next(int32_t state, uint8_t byte);
  int32_t AdvanceToken(int32_t state, int32_t token);
  bool Accepting(int32_t state) const { return accepting_[state]; }
  // Fewest bytes from `state` to an accepting state.
  int32_t Distance(int32_t state) const { return dist_[state]; }

  // The allowed tokens (bit t of word t / 64) when `remaining` tokens may still be generated (this one
  // included). Returns the cached mask, or `scratch` filled with the budget-limited one.
  const uint64_t* Mask(int32_t state, int64_t remaining, std::vector<uint64_t>* scratch);
  size_t words() const { return words_; }
  size_t num_states() const { return sets_.size(); }
  size_t cached_masks() const { return cached_; }

 private:
  int32_t Intern(std::vector<int32_t> set);
  void Closure(std::vector<int32_t>* set);
  const uint64_t* FullMask(int32_t state);

  Nfa nfa_;
  std::shared_ptr<const VocabTrie> trie_;
  std::vector<int32_t> nfa_dist_;
  std::vector<std::vector<int32_t>> sets_;
  std::unordered_map<std::string, int32_t> index_;
  std::vector<int32_t> trans_;  // 256 per state; -2 not computed yet
  std::vector<char> accepting_;
  std::vector<int32_t> dist_;
  std::vector<std::unique_ptr<uint64_t[]>> masks_;
  size_t words_;
  size_t cached_ = 0;
  std::unordered_map<int32_t, std::vector<std::pair<int32_t, int32_t>>> tail_tokens_;
  std::unordered_map<uint64_t, std::unique_ptr<uint64_t[]>> tail_masks_;
  std::vector<char> mark_;
  std::vector<int32_t> stack_state_;
  std::vector<uint32_t> stack_node_;
};

// Compiled grammars by spec text, sharing one trie per (tokenizer, vocab size, added tokens) (the worker's
// executor thread owns one). Keeps the most recently used `capacity` grammars.
class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const Tokenizer> tokenizer, int64_t vocab_size, size_t capacity = 64)
      : tokenizer_(std::move(tokenizer)), vocab_size_(vocab_size), capacity_(capacity) {}
  // Throws GrammarError for a bad spec.
  std::shared_ptr<CompiledGrammar> Get(const std::string& spec_text);

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t vocab_size_;
  size_t capacity_;
  std::shared_ptr<const VocabTrie> plain_, with_added_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<CompiledGrammar>, uint64_t>> entries_;
  uint64_t tick_ = 0;
};

// Parses and compiles a spec text, for validation (gateway): throws GrammarError.
void CheckSpec(const std::string& spec_text);

}  // namespace dsmesh::structured

// Token masks for constrained decoding. A CompiledGrammar determinizes a spec's byte NFA lazily (DFA
// state = set of NFA states, transitions computed on first use) and computes, per DFA state, the set of
// vocabulary tokens whose bytes keep the text inside the language. EOS is allowed exactly in accepting
// states. Near the end of the token budget the mask keeps only tokens after which the text can still be
// completed in the tokens left (shortest completion counted in bytes, each byte being one token at worst),
// so even a random model ends with a complete value (a budget mask keeps the tokens whose end state is
// close enough to acceptance). Not thread-safe: one executor thread uses a grammar (PrecomputeInBackground's
// thread works on a copy of its own, see there).
//
// How a state's mask is computed (once; then cached):
//   - "Text tokens" are the tokens made only of whole UTF-8 characters that a JSON string holds
//     unescaped (no '"', '\' or control character): most of the vocabulary. For a state where every
//     such character leads to one and the same state, and so on along that chain (a free string, a
//     string with length bounds, free text), a text token of n characters is allowed exactly when the
//     chain survives n characters: those tokens are added from a table sorted by character count, with
//     no per-token work (CharTarget / TextLimit below; checked on the DFA, not assumed from the schema).
//   - Every other token (and every token, for states where the characters disagree) is found by one
//     walk of a byte trie that prunes each subtree the DFA rejects: the trie of the other tokens only,
//     or the whole vocabulary's.
// Masks are precomputed when the grammar is compiled (mask_table.cc: one walk per class of equivalent
// states, usually on a background thread), so no decode step walks the vocabulary once that is done; what
// stays lazy (budget masks, grammars too large to precompute, and the masks the first steps need before
// the background thread's table is adopted) is held in an LRU cache bounded in bytes per grammar.
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/structured/nfa.h"
#include "common/tokenizer/tokenizer.h"

namespace dsmesh::structured {

// A byte trie over some tokens, as its nodes in depth-first preorder (children by byte). A walk reads it
// front to back and skips a rejected subtree by jumping to `end`, so it touches memory in order and needs
// no stack of nodes (WalkTrie in token_grammar.cc).
struct ByteTrie {
  struct Node {
    uint32_t end;    // preorder index just past this node's subtree
    int32_t token;   // first token ending at the node, -1 if none (more: VocabTrie::next_same)
    uint8_t byte;    // the byte on the edge from the parent (unused for the root, node 0)
    uint8_t unused;
    uint16_t depth;  // bytes from the root
  };
  std::vector<Node> nodes_pre;
  uint16_t max_depth = 0;
  size_t nodes() const { return nodes_pre.size(); }
};

// The vocabulary as the masks need it. Special tokens (BOS/EOS) are never in it; added non-special tokens
// (<think>, ｜DSML｜, ...) are in the `with_added` vocabulary only.
class VocabTrie {
 public:
  VocabTrie(const Tokenizer& tokenizer, int64_t vocab_size, bool with_added);
  int64_t vocab_size() const { return vocab_size_; }
  int32_t eos() const { return eos_; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  size_t words() const { return static_cast<size_t>((vocab_size_ + 63) / 64); }

  const ByteTrie& all() const { return all_; }    // every token
  const ByteTrie& rest() const { return rest_; }  // the tokens that are not text tokens
  // Further tokens with the same bytes as `id` (-1 ends the chain).
  int32_t next_same(int32_t id) const { return next_same_[id]; }

  // Text tokens (see token_grammar.h): sorted by character count; those of n characters are
  // text_tokens()[text_start(n - 1) .. text_start(n)).
  const std::vector<int32_t>& text_tokens() const { return text_tokens_; }
  size_t text_start(int32_t chars) const { return text_start_[chars]; }
  int32_t max_text_chars() const { return static_cast<int32_t>(text_start_.size()) - 1; }
  // The text tokens of at most `chars` characters (0 .. max_text_chars()), as a bitset: a state whose
  // chain survives n characters ORs in text_bits_upto(n), and a run of character counts a..b is
  // text_bits_upto(b) minus text_bits_upto(a - 1), a few thousand word operations (2 MiB per vocabulary).
  const uint64_t* text_bits_upto(int32_t chars) const { return &text_upto_[static_cast<size_t>(chars) * words()]; }
  const uint64_t* text_bits() const { return text_bits_upto(max_text_chars()); }  // all text tokens

 private:
  int64_t vocab_size_;
  int32_t eos_ = -1;
  std::vector<std::string> bytes_;
  ByteTrie all_, rest_;
  std::vector<int32_t> next_same_;
  std::vector<int32_t> text_tokens_;
  std::vector<size_t> text_start_;
  std::vector<uint64_t> text_upto_;
};

// Characters of `bytes` when it is a text token (whole UTF-8 characters, none of '"', '\' or U+0000..U+001F),
// else -1.
int TextTokenChars(std::string_view bytes);

class CompiledGrammar {
 public:
  // Bound on the bytes of cached masks and budget tables, per grammar.
  static constexpr size_t kDefaultCacheBytes = size_t{32} << 20;

  CompiledGrammar(Nfa nfa, std::shared_ptr<const VocabTrie> trie, size_t cache_bytes = kDefaultCacheBytes);
  ~CompiledGrammar();

  int32_t start() const { return 0; }
  // State after one byte / a token's bytes; -1 when the language rejects it. EOS leaves the state as is.
  int32_t Next(int32_t state, uint8_t byte);
  int32_t AdvanceToken(int32_t state, int32_t token);
  bool Accepting(int32_t state) const { return accepting_[state]; }
  // Fewest bytes from `state` to an accepting state.
  int32_t Distance(int32_t state) const { return dist_[state]; }

  // The allowed tokens (bit t of word t / 64) when `remaining` tokens may still be generated (this one
  // included). The pointer stays valid until the next Mask() call on this grammar (the cache may evict
  // it then). `scratch` is unused (kept for callers that pass one).
  const uint64_t* Mask(int32_t state, int64_t remaining, std::vector<uint64_t>* scratch);
  size_t words() const { return words_; }
  size_t num_states() const { return sets_.size(); }  // built so far

  struct CacheStats {
    size_t bytes = 0;          // held now: masks and budget tables
    size_t limit_bytes = 0;    // the bound
    size_t entries = 0;        // held now
    uint64_t evictions = 0;    // entries dropped to stay under the bound
    uint64_t full_masks = 0;   // masks computed (a recomputed evicted one counts again)
    uint64_t text_shortcut = 0;  // of those, computed with the text-token table
    uint64_t tail_masks = 0;     // budget masks built (per state and limit, near the end of the budget)
  };
  CacheStats cache_stats() const;

  // Precomputation (mask_table.cc): builds every DFA state, groups equivalent states
  // (state_classes.h) and computes the mask of each class, so that Mask() is a table lookup for every
  // state, including the first visit; identical masks are stored once. Skipped (masks stay lazy) when the
  // DFA has more than `max_states` states; stops storing masks once they would take half the cache bound
  // (the states left out stay lazy). GrammarCache::Get calls it, or PrecomputeInBackground.
  static constexpr size_t kMaxPrecomputeStates = 1 << 15;
  // Classes whose walked tokens end at different distances keep them as a budget profile (below) when
  // they are at most this many.
  static constexpr size_t kMaxProfileTokens = 8192;
  struct PrecomputeStats {
    bool done = false;          // every state has its mask in the table
    size_t states = 0;          // DFA states built
    size_t byte_classes = 0;    // classes of bytes every state treats alike
    int32_t classes = 0;        // classes of equivalent states
    size_t distinct_masks = 0;  // masks stored
    size_t profiles = 0;        // budget profiles stored
    size_t bytes = 0;           // bytes of masks and profiles
    double expand_ms = 0, classes_ms = 0, masks_ms = 0;
  };
  const PrecomputeStats& Precompute(size_t max_states = kMaxPrecomputeStates,
                                    const std::atomic<bool>* cancel = nullptr);
  // Precompute() on a thread of its own, started when a request is admitted, so that it overlaps the
  // prompt's prefill and the first steps, none of which waits for it. The thread builds a grammar of its
  // own over the same NFA (this one's DFA is the executor's, built lazily as it goes) and precomputes
  // that; the first Mask()/AdvanceToken()/Next() after it is done adopts its masks and budget profiles
  // (a few microseconds per state built so far), matching states by their set of NFA states (the two
  // DFAs number their states differently), and states built later are matched when they are built.
  // Until then a step that needs a mask computes it itself (the lazy path, into the bounded cache).
  // The steps and the thread share nothing mutable but the result, published by one atomic flag.
  // Started at most once per grammar; the destructor stops it early.
  void PrecomputeInBackground();
  // Waits for the background precomputation and adopts its result.
  const PrecomputeStats& precompute_stats() {
    WaitForPrecompute();
    AdoptIfReady();
    return pre_stats_;
  }
  // The mask of `state` by the lazy path (walk, text table), bypassing table, profiles and cache, for
  // `remaining` tokens left: for tests.
  std::vector<uint64_t> ComputeMaskForTest(int32_t state, int64_t remaining = int64_t{1} << 40);

 private:
  static constexpr int32_t kUnknown = -3;     // char_target_ / text_limit_ not computed yet
  static constexpr int32_t kMixed = -4;       // text characters lead to different states
  static constexpr int32_t kNoShortcut = -5;  // text tokens must be walked

  struct Entry {
    std::unique_ptr<uint64_t[]> bits;  // a mask or a budget mask
    size_t bytes = 0;
    std::list<uint64_t>::iterator lru;
  };

  using Profile = std::vector<std::pair<int32_t, int32_t>>;

  // What the background precomputation hands over: per state of its own DFA (found by the state's set
  // of NFA states, as index_ keys it) the index of its mask (-1: lazy) and budget profile, and the
  // least / most distance after a token; the masks and profiles themselves.
  struct Table {
    std::unordered_map<std::string, int32_t> index;
    std::vector<int32_t> mask, profile, after_min, after_max;
    std::vector<std::unique_ptr<uint64_t[]>> masks;
    std::vector<Profile> profiles;
    PrecomputeStats stats;
  };
  void AdoptIfReady() {
    if (started_ && !adopted_ && ready_.load(std::memory_order_acquire)) Adopt();
  }
  void Adopt();
  // State s (index_ key `key`) gets the table's mask and profile, when it has them.
  void MapState(int32_t s, const std::string& key);
  void WaitForPrecompute() const;
  // The transition, computed on first use (Next() without the adoption, for the precomputation itself).
  int32_t Step(int32_t state, uint8_t byte);
  int32_t Intern(std::vector<int32_t> set);
  // The closure of one NFA state (as Closure() leaves it), computed once.
  const std::vector<int32_t>& StateClosure(int32_t s);
  void Closure(std::vector<int32_t>* set);
  int32_t CharTarget(int32_t state);
  int32_t TextLimit(int32_t state);
  // Adds the allowed tokens of `state` to `mask` (zeroed, words_ long) and sets after[0] / after[1] to the
  // least / most distance after any allowed token other than EOS. Returns whether the text table was used.
  bool ComputeMask(int32_t state, uint64_t* mask, int32_t* after);
  // The same, keeping only the tokens after which the distance is at most `limit` (the budget tail); the
  // walked tokens come from the state's budget profile when it has one and `use_profile`.
  void ComputeTailMask(int32_t state, int32_t limit, uint64_t* mask, bool use_profile = true);
  // kAfter: track after[0..1] as above (and append (distance, token) to *collect_ when set); kLimit: keep
  // only tokens ending at distance <= limit.
  template <bool kAfter, bool kLimit>
  void WalkTrie(const ByteTrie& trie, int32_t state, uint64_t* mask, int32_t* after, int32_t limit);
  const uint64_t* FullMask(int32_t state);
  Entry* Find(uint64_t key);
  Entry& Insert(uint64_t key, Entry entry);
  void Evict();

  Nfa nfa_;
  std::shared_ptr<const VocabTrie> trie_;
  std::vector<int32_t> nfa_dist_;
  std::vector<std::vector<int32_t>> sets_;
  std::unordered_map<std::string, int32_t> index_;
  std::vector<int32_t> trans_;  // 256 per state; -2 not computed yet
  uint8_t byte_class_[256];                      // bytes every state treats alike share a class
  std::vector<std::vector<uint8_t>> class_bytes_;  // the bytes of each class, ascending
  std::vector<char> accepting_;
  std::vector<int32_t> dist_;
  std::vector<int32_t> char_target_;
  std::vector<int32_t> text_limit_;
  size_t words_;
  std::vector<char> mark_;
  std::vector<char> in_next_;  // Step: NFA states already in the set being built
  std::vector<std::vector<int32_t>> closures_;
  std::vector<char> closure_done_;
  std::vector<int32_t> walk_states_;  // WalkTrie: the state at each depth of the current path
  // Lazily computed masks (key kind 0) and budget masks (2), most recently used first in lru_.
  std::unordered_map<uint64_t, Entry> cache_;
  std::list<uint64_t> lru_;
  size_t cache_bytes_ = 0, cache_limit_;
  size_t touched_ = 0;  // entries used by the current Mask() call (the front of lru_): never evicted by it
  uint64_t evictions_ = 0, full_masks_ = 0, text_shortcut_ = 0, tail_masks_ = 0;
  // Precomputed (mask_table.cc): per state an index into pre_masks_ (-1: lazy).
  std::vector<int32_t> state_mask_;
  std::vector<std::unique_ptr<uint64_t[]>> pre_masks_;
  // Per state (kUnknown until its mask is computed): the least / most distance after an allowed token.
  // When the budget left covers the most, the budget mask is the full mask; the least is the floor of
  // the budget limit (some token must stay allowed).
  std::vector<int32_t> after_min_, after_max_;
  // Budget profiles (mask_table.cc): for a class whose tokens end at different distances, its walked
  // tokens (the text tokens of the shortcut excluded) as (distance after the token minus the state's
  // distance, token), sorted by that difference (trie order within one); classes with the same list
  // share it. A budget mask is then the text runs plus a prefix of the list: no walk at decode time.
  std::vector<Profile> profiles_;
  std::vector<int32_t> state_profile_;  // per state; -1: none (the budget mask walks)
  Profile* collect_ = nullptr;
  PrecomputeStats pre_stats_;
  // The background precomputation (PrecomputeInBackground).
  bool started_ = false, adopted_ = false;
  std::unique_ptr<Table> table_;       // written by the thread before it sets ready_
  std::atomic<bool> ready_{false};     // table_ is there
  std::atomic<bool> cancel_{false};    // the destructor asks the thread to stop
  std::future<void> background_;
};

// Compiled grammars by spec text, sharing one trie per (tokenizer, vocab size, added tokens) (the worker's
// executor thread owns one). Keeps the most recently used `capacity` grammars, each with its mask cache
// bounded by `cache_bytes`.
class GrammarCache {
 public:
  // When a new grammar's masks are precomputed: never (computed lazily, on first use), in Get(), or on a
  // thread started by Get() (the worker: it overlaps the prefill and the first steps, which compute their
  // masks themselves until its table is adopted).
  enum class Precompute { kNever, kAtCompile, kBackground };
  GrammarCache(std::shared_ptr<const Tokenizer> tokenizer, int64_t vocab_size, size_t capacity = 64,
               size_t cache_bytes = CompiledGrammar::kDefaultCacheBytes, Precompute precompute = Precompute::kBackground)
      : tokenizer_(std::move(tokenizer)),
        vocab_size_(vocab_size),
        capacity_(capacity),
        cache_bytes_(cache_bytes),
        precompute_(precompute) {}
  // Throws GrammarError for a bad spec.
  std::shared_ptr<CompiledGrammar> Get(const std::string& spec_text);

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t vocab_size_;
  size_t capacity_;
  size_t cache_bytes_;
  Precompute precompute_;
  std::shared_ptr<const VocabTrie> plain_, with_added_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<CompiledGrammar>, uint64_t>> entries_;
  uint64_t tick_ = 0;
};

// Parses and compiles a spec text, for validation (gateway): throws GrammarError.
void CheckSpec(const std::string& spec_text);

}  // namespace dsmesh::structured

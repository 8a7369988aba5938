#include "common/tokenizer/tokenizer.h"

#include <atomic>
#include <unordered_map>
#include <cstring>

#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/utf8.h"

namespace dsmesh {
namespace {

std::atomic<uint64_t> g_next_serial{1};

// HF's clean_up_tokenization (only when tokenizer_config.json asks for it).
std::string CleanUpTokenizationSpaces(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
      {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    const size_t flen = std::strlen(from);
    size_t pos = 0;
    for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + flen) out.append(s, pos, hit - pos).append(to);
    out.append(s, pos, std::string::npos);
    s.swap(out);
  }
  return s;
}

}  // namespace

struct Tokenizer::ThreadScratch {
  explicit ThreadScratch(size_t steps) : pre(steps) {}
  uint64_t serial = 0;
  PreTokenizerScratch pre;
  BpeScratch bpe;
  std::vector<AddedTokenMatcher::Section> sections;
};

Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::Load(const std::string& dir_or_tokenizer_json) {
  TokenizerSpec spec = ReadTokenizerSpec(dir_or_tokenizer_json);
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->Build(spec);
  return t;
}

void Tokenizer::Build(TokenizerSpec& spec) {
  path_ = spec.path;
  serial_ = g_next_serial.fetch_add(1);
  auto fail = [&](const std::string& what) { throw std::runtime_error(path_ + ": " + what); };

  int32_t max_id = -1;
  for (const auto& [s, id] : spec.vocab) {
    if (id < 0) fail("negative id " + std::to_string(id) + " in model.vocab");
    max_id = std::max(max_id, id);
  }
  for (const AddedTokenSpec& a : spec.added_tokens) {
    if (a.id < 0) fail("negative id " + std::to_string(a.id) + " in added_tokens");
    max_id = std::max(max_id, a.id);
  }
  const size_t n = size_t(max_id + 1);
  token_flags_.assign(n, 0);
  // Per id: where its spelling and its bytes come from (index into spec.vocab / spec.added_tokens).
  std::vector<int32_t> vocab_index(n, -1), added_index(n, -1);
  for (size_t i = 0; i < spec.vocab.size(); ++i) {
    const int32_t id = spec.vocab[i].second;
    if (token_flags_[id] & kDefined) fail("id " + std::to_string(id) + " appears twice in model.vocab");
    token_flags_[id] = kDefined;
    vocab_index[id] = int32_t(i);
  }
  for (size_t i = 0; i < spec.added_tokens.size(); ++i) {
    const AddedTokenSpec& a = spec.added_tokens[i];
    token_flags_[a.id] = kDefined | kAdded | (a.special ? kSpecial : 0);
    added_index[a.id] = int32_t(i);
  }

  // Spellings (IdToToken / TokenToId) and bytes (decoding): added tokens are their content,
  // vocabulary tokens decode through the ByteLevel alphabet.
  token_to_id_ = StringIdTable(n);
  spelling_offset_.assign(n + 1, 0);
  bytes_offset_.assign(n + 1, 0);
  size_t spelling_bytes = 0;
  for (const auto& [s, id] : spec.vocab) spelling_bytes += s.size();
  for (const AddedTokenSpec& a : spec.added_tokens) spelling_bytes += a.content.size();
  spelling_blob_.reserve(spelling_bytes);
  bytes_blob_.reserve(spelling_bytes);
  for (size_t id = 0; id < n; ++id) {
    spelling_offset_[id] = uint32_t(spelling_blob_.size());
    bytes_offset_[id] = uint32_t(bytes_blob_.size());
    if (added_index[id] >= 0) {
      const std::string& c = spec.added_tokens[added_index[id]].content;
      spelling_blob_ += c;
      bytes_blob_ += c;
    } else if (vocab_index[id] >= 0) {
      const std::string& s = spec.vocab[vocab_index[id]].first;
      spelling_blob_ += s;
      auto b = byte_level::ToBytes(s);
      if (!b) fail("model.vocab token '" + s + "' (id " + std::to_string(id) + ") is not in the ByteLevel alphabet");
      bytes_blob_ += *b;
    }
  }
  spelling_offset_[n] = uint32_t(spelling_blob_.size());
  bytes_offset_[n] = uint32_t(bytes_blob_.size());
  for (const auto& [s, id] : spec.vocab) token_to_id_.Set(s, id);
  // An added token's content names the added id, as in the reference (it overrides the vocabulary).
  bool shadows_vocab = false;
  for (const AddedTokenSpec& a : spec.added_tokens) {
    const auto old = token_to_id_.Find(a.content);
    shadows_vocab |= old && *old != a.id;
    token_to_id_.Set(a.content, a.id);
  }

  // BPE over bytes: the one-byte tokens, and merges translated from ByteLevel spellings to ids. The
  // merges need vocabulary ids; token_to_id_ has them unless an added token shadows a vocab spelling.
  StringIdTable vocab_only(shadows_vocab ? spec.vocab.size() : 1);
  if (shadows_vocab)
    for (const auto& [s, id] : spec.vocab) vocab_only.Set(s, id);
  const StringIdTable& vocab_ids = shadows_vocab ? vocab_only : token_to_id_;
  int32_t byte_ids[256];
  for (int b = 0; b < 256; ++b) {
    const std::string s = byte_level::FromBytes(std::string(1, char(b)));
    const auto id = vocab_ids.Find(s);
    if (!id) fail("model.vocab lacks the one-byte token '" + s + "' for byte " + std::to_string(b));
    byte_ids[b] = *id;
  }
  std::vector<BpeModel::Merge> merges;
  merges.reserve(spec.merges.size());
  constexpr size_t kBatch = 32;
  std::string joined[kBatch];
  uint64_t hashes[kBatch][3];
  for (size_t base = 0; base < spec.merges.size(); base += kBatch) {
    const size_t count = std::min(kBatch, spec.merges.size() - base);
    for (size_t k = 0; k < count; ++k) {
      const auto& [l, r] = spec.merges[base + k];
      joined[k].assign(l).append(r);
      hashes[k][0] = HashBytes(l);
      hashes[k][1] = HashBytes(r);
      hashes[k][2] = HashBytes(joined[k]);
      for (uint64_t h : hashes[k]) vocab_ids.Prefetch(h);
    }
    for (size_t k = 0; k < count; ++k) {
      const auto& [l, r] = spec.merges[base + k];
      const auto li = vocab_ids.Find(l, hashes[k][0]), ri = vocab_ids.Find(r, hashes[k][1]),
                 mi = vocab_ids.Find(joined[k], hashes[k][2]);
      if (!li || !ri || !mi) fail("model.merges entry '" + l + " " + r + "' refers to a token missing from model.vocab");
      merges.push_back({*li, *ri, *mi});
    }
  }
  std::unordered_map<std::string, int32_t> whole_words;
  if (spec.ignore_merges)
    for (const auto& [s, id] : spec.vocab) whole_words.emplace(std::string(TokenBytes(id)), id);
  bpe_ = std::make_unique<BpeModel>(byte_ids, merges, std::move(whole_words), spec.ignore_merges);
  added_ = std::make_unique<AddedTokenMatcher>(spec.added_tokens);
  pre_tokenizer_ = std::make_unique<PreTokenizer>(spec.pre_tokenizer, path_);

  auto lookup = [&](const std::optional<std::string>& t, const char* what) -> std::optional<int32_t> {
    if (!t) return std::nullopt;
    auto id = TokenToId(*t);
    if (!id) fail(std::string("tokenizer_config.json ") + what + " '" + *t + "' is not a token");
    return id;
  };
  bos_id_ = lookup(spec.bos_token, "bos_token");
  eos_id_ = lookup(spec.eos_token, "eos_token");
  add_bos_ = spec.add_bos_token;
  add_eos_ = spec.add_eos_token;
  clean_up_spaces_ = spec.clean_up_tokenization_spaces;
}

Tokenizer::ThreadScratch& Tokenizer::Scratch() const {
  // A few tokenizers per thread at most; the oldest is dropped beyond that.
  thread_local std::vector<std::unique_ptr<ThreadScratch>> per_thread;
  for (auto& s : per_thread)
    if (s->serial == serial_) return *s;
  if (per_thread.size() >= 4) per_thread.erase(per_thread.begin());
  per_thread.push_back(std::make_unique<ThreadScratch>(pre_tokenizer_->steps()));
  per_thread.back()->serial = serial_;
  return *per_thread.back();
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  const size_t bad = utf8::FindInvalid(text);
  if (bad != utf8::kValid) throw InvalidUtf8Error("invalid UTF-8 at byte offset " + std::to_string(bad));
  ThreadScratch& s = Scratch();
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 2 + 8);  // ~4 bytes per token in English, fewer in CJK or odd text
  if (add_special_tokens && add_bos_ && bos_id_) ids.push_back(*bos_id_);
  added_->Split(text, &s.sections);
  for (const AddedTokenMatcher::Section& sec : s.sections) {
    if (sec.token_id >= 0) {
      ids.push_back(sec.token_id);
      continue;
    }
    pre_tokenizer_->ForEachPiece(sec.text, &s.pre, [&](std::string_view piece) { bpe_->Encode(piece, &s.bpe, &ids); });
  }
  if (add_special_tokens && add_eos_ && eos_id_) ids.push_back(*eos_id_);
  return ids;
}

void Tokenizer::CheckId(int32_t id) const {
  if (id < 0 || size_t(id) >= token_flags_.size() || !(token_flags_[id] & kDefined))
    throw std::out_of_range("token id " + std::to_string(id) + " is not in the vocabulary of " + path_ +
                            " (vocab_size " + std::to_string(token_flags_.size()) + ")");
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  CheckId(id);
  return std::string_view(bytes_blob_).substr(bytes_offset_[id], bytes_offset_[id + 1] - bytes_offset_[id]);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string out;
  out.reserve(ids.size() * 4);
  size_t run_start = 0;  // start in `out` of the bytes of consecutive vocabulary tokens
  auto repair_run = [&] {
    const std::string_view run = std::string_view(out).substr(run_start);
    if (utf8::FindInvalid(run) == utf8::kValid) return;
    std::string fixed;
    utf8::AppendLossy(run, &fixed);
    out.resize(run_start);
    out += fixed;
  };
  for (const int32_t id : ids) {
    CheckId(id);
    const uint8_t f = token_flags_[id];
    if (skip_special_tokens && (f & kSpecial)) continue;
    const char* b = bytes_blob_.data() + bytes_offset_[id];
    const size_t len = bytes_offset_[id + 1] - bytes_offset_[id];
    if (f & kAdded) {
      repair_run();
      out.append(b, len);
      run_start = out.size();
    } else {
      out.append(b, len);
    }
  }
  repair_run();
  if (clean_up_spaces_) out = CleanUpTokenizationSpaces(std::move(out));
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const { return token_to_id_.Find(token); }

std::string Tokenizer::IdToToken(int32_t id) const {
  CheckId(id);
  return spelling_blob_.substr(spelling_offset_[id], spelling_offset_[id + 1] - spelling_offset_[id]);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && size_t(id) < token_flags_.size() && (token_flags_[id] & kSpecial);
}

bool Tokenizer::IsAdded(int32_t id) const {
  return id >= 0 && size_t(id) < token_flags_.size() && (token_flags_[id] & kAdded);
}

bool Tokenizer::regex_jit() const { return pre_tokenizer_->jit(); }

}  // namespace dsmesh

#include "common/chat/deepseek_v4_output_parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "common/chat/deepseek_v4_tokens.h"
#include "common/chat/python_json.h"

namespace dsmesh {
namespace {

constexpr std::string_view kEos = dsv4::kEos;
constexpr std::string_view kThinkStart = dsv4::kThinkStart;
constexpr std::string_view kThinkEnd = dsv4::kThinkEnd;
constexpr std::string_view kBlockOpen = dsv4::kToolCallsOpen;
constexpr std::string_view kBlockClose = dsv4::kToolCallsClose;
constexpr std::string_view kV32BlockOpen = dsv4::kFunctionCallsOpen;
constexpr std::string_view kV32BlockClose = dsv4::kFunctionCallsClose;
constexpr std::string_view kTagOpen = dsv4::kDsmlTagOpen;
constexpr std::string_view kTagClose = dsv4::kDsmlTagClose;
constexpr std::string_view kInvokeOpen = dsv4::kInvokeOpen;
constexpr std::string_view kInvokeClose = dsv4::kInvokeClose;
constexpr std::string_view kParamOpen = dsv4::kParameterOpen;
constexpr std::string_view kParamClose = dsv4::kParameterClose;
// The official format puts a blank line between the content and the DSML block; it is not content.
constexpr std::string_view kBlockSeparator = "\n\n";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Length of the longest suffix of `text` that is a proper prefix of `marker`: text that must wait,
// because the next piece may complete the marker.
size_t PartialMarkerSuffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// The longest prefix of text[0, n) that does not end inside a UTF-8 sequence.
size_t CompleteUtf8Prefix(std::string_view text, size_t n) {
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead byte
    size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

std::string RandomToolCallId() {
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[pick(rng)]);
  return id;
}

// A cursor over the DSML block text. Each Expect/Find answers "matched", "mismatch" or "need more
// text", and a mismatch is only reported when no continuation could fix it, so the parse of a
// stream never depends on where it was split.
struct Cursor {
  std::string_view text;
  size_t pos;
  enum Result { kOk, kNeedMore, kMismatch };

  Result SkipSpace() {
    while (pos < text.size() && IsSpace(text[pos])) ++pos;
    return pos < text.size() ? kOk : kNeedMore;
  }
  Result Expect(std::string_view literal) {
    size_t n = std::min(literal.size(), text.size() - pos);
    if (text.substr(pos, n) != literal.substr(0, n)) return kMismatch;
    if (n < literal.size()) return kNeedMore;
    pos += literal.size();
    return kOk;
  }
  bool LooksLike(std::string_view literal) const {  // text at pos is literal, or a prefix of it
    size_t n = std::min(literal.size(), text.size() - pos);
    return text.substr(pos, n) == literal.substr(0, n);
  }
  // Reads up to `terminator`; a '\n' or '<' first means the attribute value is malformed.
  Result ReadAttribute(std::string_view terminator, std::string* value) {
    size_t end = text.find(terminator, pos);
    size_t bad = text.find_first_of("\n<", pos);
    if (bad != std::string_view::npos && (end == std::string_view::npos || bad < end)) return kMismatch;
    if (end == std::string_view::npos) return kNeedMore;
    *value = std::string(text.substr(pos, end - pos));
    pos = end + terminator.size();
    return kOk;
  }
};

// The official parser reads an invoke's opening tag with `\s*name="(.*?)">`: any whitespace, or none,
// before the name.
Cursor::Result ExpectInvokeName(Cursor* c) {
  while (c->pos < c->text.size() && IsSpace(c->text[c->pos])) ++c->pos;
  return c->pos < c->text.size() ? c->Expect("name=\"") : Cursor::kNeedMore;
}

// Where the value of a parameter that starts at `from` ends: at the first "</｜DSML｜parameter>" that is
// followed (whitespace allowed between) by a DSML tag or the end of sentence - in well-formed output the
// next parameter, or "</｜DSML｜invoke>". A closing tag followed by other text is part of the value (a
// model quoting the tag in prose or code); the official parser allows no closing tag in a value at all.
// Whether the tag that follows is the right one is the invoke parser's business: a misspelt or misplaced
// tag makes the block malformed, it never makes this value swallow the next parameter or invoke.
// kNeedMore while the text after the first candidate cannot tell yet; at the end of the output (`final`)
// that candidate is taken. The answer only depends on the text, not on how it was split.
Cursor::Result FindValueEnd(std::string_view text, size_t from, bool final, size_t* close) {
  for (size_t at = text.find(kParamClose, from); at != std::string_view::npos; at = text.find(kParamClose, at + 1)) {
    Cursor c{text, at + kParamClose.size()};
    Cursor::Result r = c.SkipSpace();
    if (r == Cursor::kOk) {
      r = Cursor::kMismatch;
      for (std::string_view next : {kTagOpen, kTagClose, kEos}) {
        if (!c.LooksLike(next)) continue;
        if (c.text.size() - c.pos >= next.size()) {
          r = Cursor::kOk;
          break;
        }
        r = Cursor::kNeedMore;  // a prefix of this one; maybe a whole other one
      }
    }
    if (r == Cursor::kMismatch) continue;
    if (r == Cursor::kNeedMore && !final) return Cursor::kNeedMore;
    *close = at;
    return Cursor::kOk;
  }
  return Cursor::kNeedMore;
}

// A string="false" value must be one JSON value (RFC 8259, surrounding whitespace allowed): the official
// parser copies it into the arguments verbatim, so anything else would make the arguments invalid JSON.
bool IsJsonValue(std::string_view text) { return nlohmann::json::accept(text); }

}  // namespace

DeepSeekV4OutputParser::DeepSeekV4OutputParser(Options options)
    : options_(std::move(options)),
      state_(options_.thinking ? State::kReasoning : State::kContent),
      at_reasoning_start_(options_.thinking) {
  if (!options_.make_tool_call_id) options_.make_tool_call_id = RandomToolCallId;
}

std::vector<ChatOutputEvent> DeepSeekV4OutputParser::Feed(std::string_view piece) {
  std::vector<ChatOutputEvent> events;
  pending_.append(piece);
  Process(/*final=*/false, &events);
  return events;
}

std::vector<ChatOutputEvent> DeepSeekV4OutputParser::Finish() {
  std::vector<ChatOutputEvent> events;
  Process(/*final=*/true, &events);
  return events;
}

void DeepSeekV4OutputParser::Process(bool final, std::vector<ChatOutputEvent>* events) {
  for (;;) {
    bool progressed = false;
    switch (state_) {
      case State::kReasoning:
      case State::kContent: progressed = StepText(final, events); break;
      case State::kToolCalls: progressed = StepToolCalls(final, events); break;
      case State::kStrayTag: progressed = StepStrayTag(); break;
      case State::kSkipBlock: progressed = StepSkipBlock(final); break;
      case State::kDone:
        if (!pending_.empty() && !text_after_end_reported_) {
          errors_.push_back("text after <｜end▁of▁sentence｜> ignored");
          text_after_end_reported_ = true;
        }
        pending_.clear();
        break;
    }
    if (!progressed) return;
  }
}

void DeepSeekV4OutputParser::Emit(ChatOutputEvent::Kind kind, std::string text,
                                  std::vector<ChatOutputEvent>* events) {
  if (text.empty()) return;
  if (!events->empty() && events->back().kind == kind && kind != ChatOutputEvent::Kind::kToolCall) {
    events->back().text += text;
    return;
  }
  ChatOutputEvent event{kind};
  event.text = std::move(text);
  events->push_back(std::move(event));
}

// Reasoning and content: pass text through until a marker ends the section.
bool DeepSeekV4OutputParser::StepText(bool final, std::vector<ChatOutputEvent>* events) {
  const bool reasoning = state_ == State::kReasoning;
  const auto kind = reasoning ? ChatOutputEvent::Kind::kReasoning : ChatOutputEvent::Kind::kContent;
  if (reasoning && at_reasoning_start_) {
    // The prompt already opened the thinking block; a model repeating "<think>" is not reasoning text.
    if (pending_.compare(0, kThinkStart.size(), kThinkStart) == 0) {
      pending_.erase(0, kThinkStart.size());
      at_reasoning_start_ = false;
    } else if (!final && kThinkStart.substr(0, pending_.size()) == pending_) {
      return false;  // could still become "<think>"
    } else {
      at_reasoning_start_ = false;
    }
  }
  // The first of the markers that end this section wins: EOS, "</think>" (reasoning), the DSML block
  // opener (both: a tool-call block inside reasoning ends the reasoning, as vLLM's V4 reasoning parser
  // does), and, after a block that ended the reasoning, a stray "</think>" in content (dropped).
  // With tool calls off, any other DSML tag is removed too (kStrayTag).
  enum class Marker { kNone, kEos, kThinkEnd, kBlock, kStrayTag };
  Marker marker = Marker::kNone;
  size_t at = std::string::npos;
  std::string_view text_of;
  auto consider = [&](Marker m, std::string_view text) {
    size_t p = pending_.find(text);
    if (p < at) {
      at = p;
      marker = m;
      text_of = text;
    }
  };
  consider(Marker::kEos, kEos);
  consider(Marker::kBlock, kBlockOpen);
  consider(Marker::kBlock, kV32BlockOpen);
  if (reasoning || reasoning_cut_by_block_) consider(Marker::kThinkEnd, kThinkEnd);
  if (!options_.tool_calls) {
    // "<｜DSML｜" at the end may still become a block opener: wait for it (the hold below keeps it).
    const size_t p = pending_.find(kTagOpen);
    const std::string_view rest = p == std::string::npos ? std::string_view() : std::string_view(pending_).substr(p);
    const bool may_open_block =
        !final && (kBlockOpen.substr(0, rest.size()) == rest || kV32BlockOpen.substr(0, rest.size()) == rest);
    if (!may_open_block) consider(Marker::kStrayTag, kTagOpen);
    consider(Marker::kStrayTag, kTagClose);
  }
  if (marker != Marker::kNone) {
    std::string text = pending_.substr(0, at);
    pending_.erase(0, at + text_of.size());
    if (marker == Marker::kEos) {
      state_ = State::kDone;
    } else if (marker == Marker::kThinkEnd) {
      state_ = State::kContent;
      reasoning_cut_by_block_ = false;
    } else if (marker == Marker::kStrayTag) {
      errors_.push_back("DSML tag outside a tool-call block removed");
      after_stray_tag_ = state_;
      state_ = State::kStrayTag;
    } else {
      if (reasoning) reasoning_cut_by_block_ = true;
      block_opener_ = std::string(text_of);
      block_close_ = std::string(text_of == kBlockOpen ? kBlockClose : kV32BlockClose);
      if (text.size() >= kBlockSeparator.size() &&
          text.compare(text.size() - kBlockSeparator.size(), kBlockSeparator.size(), kBlockSeparator) == 0) {
        text.resize(text.size() - kBlockSeparator.size());
        block_opener_ = std::string(kBlockSeparator) + block_opener_;
      }
      calls_in_block_ = 0;
      state_ = State::kToolCalls;
    }
    Emit(kind, std::move(text), events);
    return true;
  }
  size_t emit = pending_.size();
  if (!final) {
    size_t hold = PartialMarkerSuffix(pending_, kEos);
    for (std::string_view open : {kBlockOpen, kV32BlockOpen}) {
      const std::string separated = std::string(kBlockSeparator) + std::string(open);
      hold = std::max({hold, PartialMarkerSuffix(pending_, separated), PartialMarkerSuffix(pending_, open)});
    }
    if (reasoning || reasoning_cut_by_block_) hold = std::max(hold, PartialMarkerSuffix(pending_, kThinkEnd));
    if (!options_.tool_calls) hold = std::max(hold, PartialMarkerSuffix(pending_, kTagClose));
    emit = CompleteUtf8Prefix(pending_, pending_.size() - hold);
  }
  Emit(kind, pending_.substr(0, emit), events);
  pending_.erase(0, emit);
  return false;
}

// Inside "<｜DSML｜tool_calls>": one invoke at a time, then the closing tag.
bool DeepSeekV4OutputParser::StepToolCalls(bool final, std::vector<ChatOutputEvent>* events) {
  Cursor c{pending_, 0};
  if (c.SkipSpace() == Cursor::kNeedMore) {
    if (final) AbandonToolBlock(c.pos, "unterminated DSML tool-call block", events);
    return final;
  }
  if (c.LooksLike(block_close_) && c.text.size() - c.pos >= block_close_.size()) {
    pending_.erase(0, c.pos + block_close_.size());
    state_ = State::kContent;
    return true;
  }
  if (c.LooksLike(kEos) && c.text.size() - c.pos >= kEos.size()) {
    // The model ended without closing the block: the calls it completed stand.
    errors_.push_back("DSML tool-call block not closed before <｜end▁of▁sentence｜>");
    pending_.erase(0, c.pos + kEos.size());
    state_ = State::kDone;
    return true;
  }
  if (c.LooksLike(kInvokeOpen) && c.text.size() - c.pos >= kInvokeOpen.size()) {
    // Every element of an invoke, and every text that confirms the end of a value, ends with '>':
    // without a new one the invoke cannot have become complete, so a long argument streamed in many
    // pieces is not re-parsed for each piece (a malformed invoke may be noticed a piece later; the
    // result is the same).
    if (!final && invoke_wait_from_ > 0 && pending_.find('>', invoke_wait_from_) == std::string::npos) return false;
    invoke_wait_from_ = 0;
    GeneratedToolCall call;
    size_t end = 0;
    std::string error;
    InvokeStatus status = ParseInvoke(c.pos, final, &call, &end, &error);
    if (status == InvokeStatus::kComplete) {
      if (options_.tool_calls) {
        call.id = options_.make_tool_call_id();
        ChatOutputEvent event{ChatOutputEvent::Kind::kToolCall};
        event.tool_call = std::move(call);
        event.tool_index = tool_calls_emitted_++;
        events->push_back(std::move(event));
      } else {
        ++suppressed_calls_;
      }
      ++calls_in_block_;
      pending_.erase(0, end);
      return true;
    }
    if (status == InvokeStatus::kMalformed) {
      AbandonToolBlock(c.pos, error, events);
      return true;
    }
    if (final) AbandonToolBlock(c.pos, "unterminated <｜DSML｜invoke>", events);
    invoke_wait_from_ = pending_.size();
    return final;
  }
  if (!final && (c.LooksLike(block_close_) || c.LooksLike(kInvokeOpen) || c.LooksLike(kEos))) return false;
  AbandonToolBlock(c.pos, "unexpected text in DSML tool-call block", events);
  return true;
}

DeepSeekV4OutputParser::InvokeStatus DeepSeekV4OutputParser::ParseInvoke(size_t start, bool final,
                                                                          GeneratedToolCall* call, size_t* end,
                                                                          std::string* error) {
  Cursor c{pending_, start + kInvokeOpen.size()};
  auto fail = [&](const std::string& what) {
    *error = "malformed <｜DSML｜invoke>: " + what;
    return InvokeStatus::kMalformed;
  };
  // Maps a cursor result to a status, or std::nullopt to keep going.
  auto check = [&](Cursor::Result r, const char* what) -> std::optional<InvokeStatus> {
    if (r == Cursor::kOk) return std::nullopt;
    if (r == Cursor::kNeedMore) return InvokeStatus::kNeedMore;
    return fail(what);
  };
  if (auto s = check(ExpectInvokeName(&c), "expected name=\"...\"")) return *s;
  if (auto s = check(c.ReadAttribute("\">", &call->name), "bad tool name")) return *s;
  if (call->name.empty()) return fail("empty tool name");

  std::string arguments = "{";
  std::set<std::string> seen;
  for (;;) {
    if (auto s = check(c.SkipSpace(), "")) return *s;
    if (c.LooksLike(kInvokeClose)) {
      if (auto s = check(c.Expect(kInvokeClose), "")) return *s;
      call->arguments = arguments + "}";
      *end = c.pos;
      return InvokeStatus::kComplete;
    }
    if (!c.LooksLike(kParamOpen)) return fail("expected <｜DSML｜parameter or </｜DSML｜invoke>");
    if (auto s = check(c.Expect(kParamOpen), "")) return *s;
    std::string key, is_string;
    if (auto s = check(c.Expect(" name=\""), "expected parameter name=\"...\"")) return *s;
    if (auto s = check(c.ReadAttribute("\"", &key), "bad parameter name")) return *s;
    if (auto s = check(c.Expect(" string=\""), "expected string=\"true|false\"")) return *s;
    if (auto s = check(c.ReadAttribute("\">", &is_string), "bad string attribute")) return *s;
    if (is_string != "true" && is_string != "false") return fail("string=\"" + is_string + "\" is not true|false");
    size_t close = 0;
    if (FindValueEnd(pending_, c.pos, final, &close) != Cursor::kOk) return InvokeStatus::kNeedMore;
    std::string value = pending_.substr(c.pos, close - c.pos);
    c.pos = close + kParamClose.size();
    if (!seen.insert(key).second) return fail("duplicate parameter '" + key + "'");
    if (is_string == "false" && !IsJsonValue(value))
      return fail("parameter '" + key + "' has string=\"false\" but its value is not JSON");
    // The official decoder: strings are JSON-quoted, other values are already JSON and kept verbatim.
    if (seen.size() > 1) arguments += ", ";
    arguments += PythonJsonQuote(key) + ": " + (is_string == "true" ? PythonJsonQuote(value) : value);
  }
}

// A DSML block that does not parse: its text so far (with the opener, if no call of this block was
// emitted) becomes content, and the rest of the stream is read as content again.
void DeepSeekV4OutputParser::AbandonToolBlock(size_t from, const std::string& error,
                                              std::vector<ChatOutputEvent>* events) {
  errors_.push_back(error);
  ++malformed_blocks_;
  std::string raw = (calls_in_block_ == 0 ? block_opener_ : std::string()) + pending_.substr(0, from);
  pending_.erase(0, from);
  if (options_.tool_calls) {
    Emit(ChatOutputEvent::Kind::kContent, std::move(raw), events);
    state_ = State::kContent;
    return;
  }
  // Tool calls off: the block is not the answer; the rest of it, up to its closing tag (or the end of
  // sentence, or of the output), is removed too.
  state_ = State::kSkipBlock;
}

bool DeepSeekV4OutputParser::StepSkipBlock(bool final) {
  const size_t close = pending_.find(block_close_), eos = pending_.find(kEos);
  if (close != std::string::npos && (eos == std::string::npos || close < eos)) {
    pending_.erase(0, close + block_close_.size());
    state_ = State::kContent;
    return true;
  }
  if (eos != std::string::npos) {
    pending_.erase(0, eos);  // StepText ends the output there
    state_ = State::kContent;
    return true;
  }
  const size_t hold = final ? 0
                            : std::max(PartialMarkerSuffix(pending_, block_close_), PartialMarkerSuffix(pending_, kEos));
  pending_.erase(0, pending_.size() - hold);
  return false;
}

// A DSML tag removed while tool calls are off: up to its '>' or the end of the line, or up to the next '<'
// (which may start a marker of its own).
bool DeepSeekV4OutputParser::StepStrayTag() {
  size_t end = pending_.find_first_of(">\n<");
  if (end == std::string::npos) {
    pending_.clear();  // all of it belongs to the tag
    return false;
  }
  pending_.erase(0, pending_[end] == '>' ? end + 1 : end);
  state_ = after_stray_tag_;
  return true;
}

ParsedCompletion ParseDeepSeekV4Completion(std::string_view text, DeepSeekV4OutputParser::Options options) {
  DeepSeekV4OutputParser parser(std::move(options));
  std::vector<ChatOutputEvent> events = parser.Feed(text);
  for (ChatOutputEvent& e : parser.Finish()) events.push_back(std::move(e));
  ParsedCompletion out;
  for (ChatOutputEvent& e : events) {
    switch (e.kind) {
      case ChatOutputEvent::Kind::kReasoning: out.reasoning_content += e.text; break;
      case ChatOutputEvent::Kind::kContent: out.content += e.text; break;
      case ChatOutputEvent::Kind::kToolCall: out.tool_calls.push_back(std::move(e.tool_call)); break;
    }
  }
  out.errors = parser.errors();
  out.malformed_blocks = parser.malformed_blocks();
  out.suppressed_calls = parser.suppressed_calls();
  return out;
}

}  // namespace dsmesh

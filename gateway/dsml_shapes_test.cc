// Tool calls that never get lost: 478 generated DSML outputs (common/chat/dsml_shapes.h: well-formed ones in
// the official spellings, ones only this parser accepts, broken ones) through the gateway's streaming
// decoding. Each text is fed to the chat output splitter whole, split in two at every byte, and one byte at
// a time, and through ChoiceDecoder as the real V4 tokenizer's tokens, one per engine message. Every
// well-formed call must come back as a tool call with exactly the expected arguments and no DSML in the
// content; every broken block must come back as content (the calls before the break stand) and be counted;
// with tool calls off (tool_choice "none") no call and no DSML text may come back.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/chat/chat_test_util.h"
#include "common/chat/dsml_shapes.h"
#include "common/repo_file.h"
#include "gateway/choice_decoder.h"
#include "gateway/output_splitter.h"

namespace dsmesh {
namespace {

using dsml_shapes::Shape;

// Every malformed block is logged as a warning; thousands of parses would bury the test's own output.
const bool kQuiet = (spdlog::set_level(spdlog::level::err), true);

constexpr uint64_t kSeed = 43;
const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = dsml_shapes::Generate(kSeed, 260, 90, 128);
  return shapes;
}

struct Result {
  OutputDelta total;
  int malformed = 0, suppressed = 0;
};

std::string Describe(const Shape& s) {
  return std::string(dsml_shapes::KindName(s.kind)) + " shape \"" + s.description + "\" (" +
         (s.thinking ? "thinking" : "chat") + "):\n" + s.text;
}

// Feeds `text` cut at `cuts` (byte offsets) to a fresh chat splitter.
Result Split(const Shape& s, const std::vector<size_t>& cuts, bool tool_calls) {
  auto splitter = MakeChatOutputSplitter(s.thinking, "test", tool_calls);
  Result r;
  size_t from = 0;
  auto take = [&](const OutputDelta& d) {
    // Deltas are whole characters (a client may print each one).
    EXPECT_TRUE(chat_test::IsValidUtf8(d.reasoning)) << d.reasoning;
    EXPECT_TRUE(chat_test::IsValidUtf8(d.content)) << d.content;
    AppendDelta(d, &r.total);
  };
  for (size_t k = 0; k <= cuts.size(); ++k) {
    const size_t to = k < cuts.size() ? cuts[k] : s.text.size();
    take(splitter->Push(s.text.substr(from, to - from)));
    from = to;
  }
  take(splitter->Finish());
  r.malformed = splitter->malformed_tool_call_blocks();
  r.suppressed = splitter->suppressed_tool_calls();
  EXPECT_EQ(splitter->tool_calls_seen(), static_cast<int>(r.total.tool_calls.size()));
  return r;
}

void ExpectSame(const Result& got, const Result& want) {
  EXPECT_EQ(got.total.reasoning, want.total.reasoning);
  EXPECT_EQ(got.total.content, want.total.content);
  ASSERT_EQ(got.total.tool_calls.size(), want.total.tool_calls.size());
  for (size_t i = 0; i < want.total.tool_calls.size(); ++i) {
    EXPECT_EQ(got.total.tool_calls[i].name, want.total.tool_calls[i].name);
    EXPECT_EQ(got.total.tool_calls[i].arguments, want.total.tool_calls[i].arguments);
  }
  EXPECT_EQ(got.malformed, want.malformed);
  EXPECT_EQ(got.suppressed, want.suppressed);
}

// The whole text, against what the shape says.
void ExpectShape(const Shape& s, const Result& got) {
  EXPECT_EQ(got.total.reasoning, s.reasoning);
  EXPECT_EQ(got.total.content, s.content);
  ASSERT_EQ(got.total.tool_calls.size(), s.calls.size());
  for (size_t i = 0; i < s.calls.size(); ++i) {
    EXPECT_EQ(got.total.tool_calls[i].index, static_cast<int>(i));
    EXPECT_EQ(got.total.tool_calls[i].name, s.calls[i].name);
    EXPECT_EQ(got.total.tool_calls[i].arguments, s.calls[i].arguments);
    EXPECT_TRUE(nlohmann::json::accept(got.total.tool_calls[i].arguments)) << got.total.tool_calls[i].arguments;
    EXPECT_EQ(got.total.tool_calls[i].id.rfind("call_", 0), 0u);
  }
  EXPECT_EQ(got.malformed, static_cast<int>(s.malformed_blocks));
  if (s.kind != Shape::Kind::kBroken) EXPECT_EQ(got.total.content.find("｜DSML｜"), std::string::npos);
}

TEST(DsmlShapesTest, EnoughShapesOfEveryKind) {
  size_t official = 0, lenient = 0, broken = 0, calls = 0;
  for (const Shape& s : Shapes()) {
    (s.kind == Shape::Kind::kOfficial ? official : s.kind == Shape::Kind::kLenient ? lenient : broken)++;
    calls += s.calls.size();
  }
  EXPECT_GE(official + lenient + broken, 400u);
  EXPECT_GE(official, 250u);
  EXPECT_GE(lenient, 80u);
  EXPECT_GE(broken, 120u);
  EXPECT_GE(calls, 500u);
}

TEST(DsmlShapesTest, WholeAndSplitAtEveryByte) {
  for (const Shape& s : Shapes()) {
    SCOPED_TRACE(Describe(s));
    const Result whole = Split(s, {}, true);
    ExpectShape(s, whole);
    if (HasFailure()) return;
    for (size_t cut = 1; cut < s.text.size(); ++cut) {
      SCOPED_TRACE("split at byte " + std::to_string(cut));
      ExpectSame(Split(s, {cut}, true), whole);
      if (HasFailure()) return;
    }
    std::vector<size_t> every(s.text.size() > 0 ? s.text.size() - 1 : 0);
    for (size_t i = 0; i < every.size(); ++i) every[i] = i + 1;
    SCOPED_TRACE("one byte at a time");
    ExpectSame(Split(s, every, true), whole);
    if (HasFailure()) return;
  }
}

// tool_choice "none" (or no tools): the model wrote DSML anyway. No call comes back and no DSML text: the
// blocks are removed, the text around them is the content.
TEST(DsmlShapesTest, ToolCallsOffReturnNoDsml) {
  for (const Shape& s : Shapes()) {
    SCOPED_TRACE(Describe(s));
    const Result whole = Split(s, {}, false);
    EXPECT_TRUE(whole.total.tool_calls.empty());
    EXPECT_EQ(whole.total.content.find("｜DSML｜"), std::string::npos) << whole.total.content;
    EXPECT_EQ(whole.total.reasoning.find("｜DSML｜"), std::string::npos) << whole.total.reasoning;
    EXPECT_EQ(whole.total.content, s.content_without_tools);
    EXPECT_EQ(whole.total.reasoning, s.reasoning);
    EXPECT_EQ(whole.suppressed, static_cast<int>(s.calls.size()));
    EXPECT_EQ(whole.malformed, static_cast<int>(s.malformed_blocks));
    if (HasFailure()) return;
    for (size_t cut = 1; cut < s.text.size(); cut += 7) {
      SCOPED_TRACE("split at byte " + std::to_string(cut));
      ExpectSame(Split(s, {cut}, false), whole);
      if (HasFailure()) return;
    }
  }
}

std::shared_ptr<const Tokenizer> V4() {
  static auto tok = [] {
    std::string f = RepoFile("common/tokenizer/data/deepseek_v4/tokenizer.json");
    return Tokenizer::Load(f.substr(0, f.rfind('/')));
  }();
  return tok;
}

// Through ChoiceDecoder the way the engine streams it: the V4 tokenizer's tokens (DSML markers, "</think>"
// and EOS are single tokens; a character may be split across byte-level tokens), one per message, then the
// finish. Finish reason "tool_calls" exactly when a call came back; the counts land in the choice output.
TEST(DsmlShapesTest, ThroughChoiceDecoderTokenByToken) {
  for (const Shape& s : Shapes()) {
    SCOPED_TRACE(Describe(s));
    const std::vector<int32_t> ids = V4()->Encode(s.text);
    ASSERT_EQ(V4()->Decode(ids), s.text);
    const std::string eos = "<｜end▁of▁sentence｜>";
    const bool ends_with_eos = s.text.size() >= eos.size() && s.text.compare(s.text.size() - eos.size(), eos.size(), eos) == 0;
    for (bool tool_calls : {true, false}) {
      RequestOptions options;
      options.tool_calls = tool_calls;
      ChoiceDecoder decoder(0, V4(), options, /*chat=*/true, s.thinking, "test");
      OutputDelta streamed;
      for (size_t i = 0; i < ids.size(); ++i) {
        GenerateResponse m;
        m.add_token_ids(ids[i]);
        m.set_completion_tokens(static_cast<int>(i + 1));
        if (i + 1 == ids.size()) m.set_finish_reason(ends_with_eos ? FINISH_STOP : FINISH_LENGTH);
        ChoiceStep step = decoder.Consume(m);
        ASSERT_FALSE(step.aborted);
        AppendDelta(step.delta, &streamed);
      }
      ASSERT_TRUE(decoder.finished());
      const ChoiceOutput& out = decoder.output();
      Result got{streamed, out.malformed_tool_call_blocks, out.suppressed_tool_calls};
      if (tool_calls) {
        ExpectShape(s, got);
        EXPECT_EQ(out.finish_reason, !ends_with_eos ? "length" : s.calls.empty() ? "stop" : "tool_calls");
      } else {
        EXPECT_TRUE(streamed.tool_calls.empty());
        EXPECT_EQ(streamed.content, s.content_without_tools);
        EXPECT_EQ(out.suppressed_tool_calls, static_cast<int>(s.calls.size()));
        EXPECT_EQ(out.finish_reason, ends_with_eos ? "stop" : "length");
      }
      EXPECT_EQ(out.total.content, streamed.content);
      if (HasFailure()) return;
    }
  }
}

// With DSMESH_DSML_SHAPES_OUT set, writes every shape and its expected split for
// common/chat/testdata/tools/check_dsml_shapes.py, which runs DeepSeek's parser over them.
TEST(DsmlShapesTest, DumpForTheOfficialParser) {
  const char* path = std::getenv("DSMESH_DSML_SHAPES_OUT");
  if (!path) GTEST_SKIP() << "DSMESH_DSML_SHAPES_OUT not set";
  nlohmann::json all = nlohmann::json::array();
  for (const Shape& s : Shapes()) {
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& c : s.calls) calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
    all.push_back({{"kind", dsml_shapes::KindName(s.kind)}, {"description", s.description}, {"thinking", s.thinking}, {"text", s.text},
                   {"reasoning_content", s.reasoning}, {"content", s.content}, {"tool_calls", calls}});
  }
  std::ofstream(path) << all.dump(1) << "\n";
}

}  // namespace
}  // namespace dsmesh

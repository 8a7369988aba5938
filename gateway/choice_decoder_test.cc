// ChoiceDecoder (incremental detokenizer + the DeepSeek-V4 output splitter) on the hard outputs users
// report for V4, with the real V4 tokenizer: each text is tokenized the way the model emits it (DSML
// markers, "</think>" and EOS are single tokens, CJK and emoji often split a character across byte-level
// tokens), and the engine's messages carry those tokens all at once, one per message, and split in two
// at every token boundary. The concatenated step deltas must equal the finished choice, the finished
// choice must equal the one-shot parse of the text, every delta must be whole UTF-8, and the finish
// reason must be what the OpenAI API says for it.
#include "gateway/choice_decoder.h"

#include <gtest/gtest.h>

#include "common/chat/chat_test_util.h"
#include "common/chat/deepseek_v4_output_parser.h"
#include "common/repo_file.h"

namespace dsmesh {
namespace {

std::shared_ptr<const Tokenizer> V4() {
  static auto tok = [] {
    std::string f = RepoFile("common/tokenizer/data/deepseek_v4/tokenizer.json");
    return Tokenizer::Load(f.substr(0, f.rfind('/')));
  }();
  return tok;
}

const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kOpen = "<｜DSML｜tool_calls>\n";
const std::string kClose = "</｜DSML｜tool_calls>";
std::string Invoke(const std::string& name, const std::string& params) {
  return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "</｜DSML｜invoke>\n";
}
std::string Param(const std::string& k, bool is_string, const std::string& v) {
  return "<｜DSML｜parameter name=\"" + k + "\" string=\"" + (is_string ? "true" : "false") + "\">" + v +
         "</｜DSML｜parameter>\n";
}

struct Case {
  std::string name;
  bool thinking;
  std::string text;  // what the model generates (EOS included when it stopped by itself)
  FinishReason engine_finish;
  std::string finish_reason;  // what the choice reports
};

std::vector<Case> Cases() {
  const std::string weather = Invoke("get_weather", Param("city", true, "Paris") + Param("days", false, "3"));
  return {
      {"reasoning never closed (max_tokens)", true,
       "Let me weigh 東京 against Zürich 🏔🧠 carefully, one step at a time, and then perhaps", FINISH_LENGTH,
       "length"},
      {"reasoning cut inside </think>", true, "Still thinking about 漢字 </thi", FINISH_LENGTH, "length"},
      {"tool call inside reasoning", true, "I should look it up first.\n\n" + kOpen + weather + kClose + kEos,
       FINISH_STOP, "tool_calls"},
      {"parallel calls", true,
       "Plan: three lookups.</think>On it.\n\n" + kOpen +
           Invoke("get_weather", Param("city", true, "東京") + Param("days", false, "2")) +
           Invoke("get_weather", Param("city", true, "Zürich 🏔")) +
           Invoke("search", Param("q", true, "a \"quoted\"\nline") + Param("filters", false, R"({"year": [2024]})")) +
           kClose + kEos,
       FINISH_STOP, "tool_calls"},
      {"DSML text inside arguments", false,
       "Writing the docs.\n\n" + kOpen +
           Invoke("write_file", Param("path", true, "dsml.md") +
                                    Param("text", true,
                                          "a value ends at </｜DSML｜parameter> and a call at </｜DSML｜invoke>\n"
                                          "<｜DSML｜invoke name=\"rm\"> is only an example")) +
           Invoke("note", Param("text", true, "quotes </｜DSML｜parameter> and </｜DSML｜tool_calls> in prose")) + kClose +
           kEos,
       FINISH_STOP, "tool_calls"},
      {"malformed block falls back to content", false,
       "Answer.\n\n" + kOpen + "<｜DSML｜invoke name=unquoted>\n" + kClose + kEos, FINISH_STOP, "stop"},
  };
}

struct Result {
  OutputDelta streamed;
  ChoiceOutput output;
};

// Feeds `ids` to a fresh decoder in messages cut at `cuts` (token indices); the last message carries
// the engine's finish reason.
Result Decode(const Case& c, const std::vector<int32_t>& ids, const std::vector<size_t>& cuts) {
  RequestOptions options;
  ChoiceDecoder decoder(0, V4(), options, /*chat=*/true, c.thinking, "test");
  Result r;
  size_t from = 0;
  for (size_t k = 0; k <= cuts.size(); ++k) {
    const size_t to = k < cuts.size() ? cuts[k] : ids.size();
    GenerateResponse m;
    for (size_t i = from; i < to; ++i) m.add_token_ids(ids[i]);
    m.set_completion_tokens(static_cast<int>(to));
    if (k == cuts.size()) m.set_finish_reason(c.engine_finish);
    ChoiceStep step = decoder.Consume(m);
    EXPECT_FALSE(step.aborted);
    EXPECT_TRUE(chat_test::IsValidUtf8(step.delta.reasoning)) << step.delta.reasoning;
    EXPECT_TRUE(chat_test::IsValidUtf8(step.delta.content)) << step.delta.content;
    EXPECT_EQ(step.finished, k == cuts.size());
    AppendDelta(step.delta, &r.streamed);
    from = to;
  }
  EXPECT_TRUE(decoder.finished());
  r.output = decoder.output();
  return r;
}

void ExpectSameDelta(const OutputDelta& got, const OutputDelta& want) {
  EXPECT_EQ(got.reasoning, want.reasoning);
  EXPECT_EQ(got.content, want.content);
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size());
  for (size_t i = 0; i < want.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].index, want.tool_calls[i].index);
    EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name);
    EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments);
    EXPECT_FALSE(got.tool_calls[i].id.empty());
  }
}

TEST(ChoiceDecoderTest, HardV4OutputsAtEveryTokenBoundary) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<int32_t> ids = V4()->Encode(c.text);
    ASSERT_EQ(V4()->Decode(ids), c.text);
    // The text the engine's tokens decode to, split by the parser in one go (the detokenizer drops
    // nothing for chat: markers and EOS stay in the text the parser sees).
    ParsedCompletion want = ParseDeepSeekV4Completion(c.text, {c.thinking, {}});

    Result whole = Decode(c, ids, {});
    EXPECT_EQ(whole.output.finish_reason, c.finish_reason);
    EXPECT_EQ(whole.output.total.reasoning, want.reasoning_content);
    EXPECT_EQ(whole.output.total.content, want.content);
    ASSERT_EQ(whole.output.total.tool_calls.size(), want.tool_calls.size());
    for (size_t i = 0; i < want.tool_calls.size(); ++i) {
      EXPECT_EQ(whole.output.total.tool_calls[i].index, static_cast<int>(i));
      EXPECT_EQ(whole.output.total.tool_calls[i].name, want.tool_calls[i].name);
      EXPECT_EQ(whole.output.total.tool_calls[i].arguments, want.tool_calls[i].arguments);
    }
    ExpectSameDelta(whole.streamed, whole.output.total);

    std::vector<size_t> every;
    for (size_t i = 1; i < ids.size(); ++i) every.push_back(i);
    SCOPED_TRACE("one token per message");
    Result one = Decode(c, ids, every);
    EXPECT_EQ(one.output.finish_reason, c.finish_reason);
    ExpectSameDelta(one.streamed, whole.output.total);
    ExpectSameDelta(one.output.total, whole.output.total);
    for (size_t cut = 1; cut < ids.size(); ++cut) {
      SCOPED_TRACE("two messages, cut before token " + std::to_string(cut));
      Result two = Decode(c, ids, {cut});
      ExpectSameDelta(two.streamed, whole.output.total);
      EXPECT_EQ(two.output.finish_reason, c.finish_reason);
      if (HasFailure()) return;
    }
  }
}

// The split the cases above are about, stated directly (the parser's own test covers the byte level).
TEST(ChoiceDecoderTest, HardV4OutputsSplitAsTheApiSays) {
  std::vector<Case> cases = Cases();
  auto run = [&](size_t i) { return Decode(cases[i], V4()->Encode(cases[i].text), {}).output; };
  ChoiceOutput unclosed = run(0);
  EXPECT_EQ(unclosed.total.reasoning, cases[0].text);
  EXPECT_EQ(unclosed.total.content, "");
  EXPECT_EQ(unclosed.finish_reason, "length");
  ChoiceOutput cut_marker = run(1);
  EXPECT_EQ(cut_marker.total.reasoning, cases[1].text);
  ChoiceOutput in_reasoning = run(2);
  EXPECT_EQ(in_reasoning.total.reasoning, "I should look it up first.");
  EXPECT_EQ(in_reasoning.total.content, "");
  ASSERT_EQ(in_reasoning.total.tool_calls.size(), 1u);
  EXPECT_EQ(in_reasoning.total.tool_calls[0].arguments, R"({"city": "Paris", "days": 3})");
  ChoiceOutput parallel = run(3);
  EXPECT_EQ(parallel.total.content, "On it.");
  ASSERT_EQ(parallel.total.tool_calls.size(), 3u);
  EXPECT_EQ(parallel.total.tool_calls[1].arguments, R"({"city": "Zürich 🏔"})");
  EXPECT_EQ(parallel.total.tool_calls[2].arguments, R"({"q": "a \"quoted\"\nline", "filters": {"year": [2024]}})");
  ChoiceOutput dsml = run(4);
  ASSERT_EQ(dsml.total.tool_calls.size(), 2u);
  EXPECT_EQ(dsml.total.tool_calls[1].arguments, R"({"text": "quotes </｜DSML｜parameter> and </｜DSML｜tool_calls> in prose"})");
  ChoiceOutput malformed = run(5);
  EXPECT_TRUE(malformed.total.tool_calls.empty());
  EXPECT_EQ(malformed.total.content, "Answer.\n\n" + kOpen + "<｜DSML｜invoke name=unquoted>\n" + kClose);
  EXPECT_EQ(malformed.finish_reason, "stop");
}

}  // namespace
}  // namespace dsmesh

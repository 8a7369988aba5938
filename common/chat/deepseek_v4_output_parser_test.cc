// The V4 output parser against DeepSeek's official parse_message_from_completion_text (its results
// for 24 samples are in testdata/v4_parse/official_parse.json), and streaming: for every sample and
// every split point (and one byte at a time) the concatenated deltas equal the one-shot parse.
#include "common/chat/deepseek_v4_output_parser.h"

#include <gtest/gtest.h>

#include <tuple>

#include "common/chat/chat_test_util.h"
#include "common/chat/deepseek_v4_prompt.h"
#include "common/chat/python_json.h"

namespace dsmesh {
namespace {

using Json = nlohmann::ordered_json;

DeepSeekV4OutputParser::Options Opts(bool thinking, bool tool_calls = true) {
  auto counter = std::make_shared<int>(0);
  return {thinking, [counter] { return "call_" + std::to_string((*counter)++); }, tool_calls};
}

// Feeds `pieces` one by one and collects the result like ParseDeepSeekV4Completion does, checking
// that every delta is whole UTF-8.
ParsedCompletion FeedPieces(const std::vector<std::string>& pieces, bool thinking, bool tool_calls = true) {
  DeepSeekV4OutputParser parser(Opts(thinking, tool_calls));
  ParsedCompletion out;
  auto take = [&](std::vector<ChatOutputEvent> events) {
    for (ChatOutputEvent& e : events) {
      if (e.kind != ChatOutputEvent::Kind::kToolCall) {
        EXPECT_FALSE(e.text.empty());
        EXPECT_TRUE(chat_test::IsValidUtf8(e.text)) << "delta splits a character: " << e.text;
      }
      switch (e.kind) {
        case ChatOutputEvent::Kind::kReasoning: out.reasoning_content += e.text; break;
        case ChatOutputEvent::Kind::kContent: out.content += e.text; break;
        case ChatOutputEvent::Kind::kToolCall:
          EXPECT_EQ(e.tool_index, out.tool_calls.size());
          out.tool_calls.push_back(e.tool_call);
          break;
      }
    }
  };
  for (const std::string& p : pieces) take(parser.Feed(p));
  take(parser.Finish());
  out.errors = parser.errors();
  out.malformed_blocks = parser.malformed_blocks();
  out.suppressed_calls = parser.suppressed_calls();
  return out;
}

void ExpectSame(const ParsedCompletion& want, const ParsedCompletion& got) {
  EXPECT_EQ(got.reasoning_content, want.reasoning_content);
  EXPECT_EQ(got.content, want.content);
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size());
  for (size_t i = 0; i < want.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].id, want.tool_calls[i].id);
    EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name);
    EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments);
  }
  EXPECT_EQ(got.errors.size(), want.errors.size());
  EXPECT_EQ(got.malformed_blocks, want.malformed_blocks);
  EXPECT_EQ(got.suppressed_calls, want.suppressed_calls);
}

// Every way of cutting `text` in two, and one byte at a time, gives the one-shot result.
void ExpectStreamingMatchesOneShot(const std::string& text, bool thinking, bool tool_calls = true) {
  ParsedCompletion one_shot = ParseDeepSeekV4Completion(text, Opts(thinking, tool_calls));
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    SCOPED_TRACE("split at byte " + std::to_string(cut));
    ExpectSame(one_shot, FeedPieces({text.substr(0, cut), text.substr(cut)}, thinking, tool_calls));
    if (testing::Test::HasFailure()) return;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  SCOPED_TRACE("one byte at a time");
  ExpectSame(one_shot, FeedPieces(bytes, thinking, tool_calls));
}

std::vector<Json> OfficialSamples() {
  std::string path = std::string(chat_test::kTestdata) + "/v4_parse/official_parse.json";
  Json all = ParseJsonText(chat_test::ReadFile(path), path);
  return std::vector<Json>(all.begin(), all.end());
}

// Where the official parser returns arguments that are not JSON (a string="false" value that is not JSON,
// copied verbatim), the block is malformed here: its text is content, from the blank line before it to EOS.
bool HasNonJsonArguments(const Json& want) {
  for (const Json& call : want["tool_calls"])
    if (!nlohmann::json::accept(call["arguments"].get<std::string>())) return true;
  return false;
}

TEST(DeepSeekV4OutputParserTest, MatchesOfficialParser) {
  std::vector<Json> samples = OfficialSamples();
  ASSERT_GE(samples.size(), 20u);
  int non_json = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    SCOPED_TRACE("sample " + std::to_string(i));
    const Json& s = samples[i];
    const std::string completion = s["completion"].get<std::string>();
    ParsedCompletion got = ParseDeepSeekV4Completion(completion, Opts(s["thinking"]));
    const Json& want = s["expected"];
    if (HasNonJsonArguments(want)) {
      ++non_json;
      const size_t block = completion.find("\n\n<｜DSML｜tool_calls>");
      const size_t eos = completion.rfind("<｜end▁of▁sentence｜>");
      ASSERT_NE(block, std::string::npos);
      EXPECT_EQ(got.reasoning_content, want["reasoning_content"].get<std::string>());
      EXPECT_EQ(got.content, want["content"].get<std::string>() + completion.substr(block, eos - block));
      EXPECT_TRUE(got.tool_calls.empty());
      EXPECT_EQ(got.malformed_blocks, 1u);
      continue;
    }
    EXPECT_EQ(got.reasoning_content, want["reasoning_content"].get<std::string>());
    EXPECT_EQ(got.content, want["content"].get<std::string>());
    EXPECT_TRUE(got.errors.empty()) << got.errors.front();
    ASSERT_EQ(got.tool_calls.size(), want["tool_calls"].size());
    for (size_t k = 0; k < got.tool_calls.size(); ++k) {
      EXPECT_EQ(got.tool_calls[k].name, want["tool_calls"][k]["name"].get<std::string>());
      EXPECT_EQ(got.tool_calls[k].arguments, want["tool_calls"][k]["arguments"].get<std::string>());
      EXPECT_EQ(got.tool_calls[k].id, "call_" + std::to_string(k));
    }
  }
  EXPECT_EQ(non_json, 1);  // the "not json at all" sample
}

TEST(DeepSeekV4OutputParserTest, StreamingEqualsOneShotOnOfficialSamples) {
  for (const Json& s : OfficialSamples()) {
    SCOPED_TRACE(s["completion"].get<std::string>());
    ExpectStreamingMatchesOneShot(s["completion"].get<std::string>(), s["thinking"]);
    if (HasFailure()) return;
  }
}

// Outputs the official parser rejects (it raises); ours degrades to content and reports the problem,
// the same way however the text is split.
TEST(DeepSeekV4OutputParserTest, MalformedOutputBecomesContentAndIsReported) {
  const std::string eos = "<｜end▁of▁sentence｜>";
  struct Case {
    bool thinking;
    std::string text;
    std::string content;  // expected content of the one-shot parse
    size_t calls;
  };
  const std::vector<Case> cases = {
      // Missing quote on the tool name.
      {false, "x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=bad>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + eos,
       "x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=bad>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", 0},
      // string attribute neither true nor false, in the second invoke: the first call survives.
      {true,
       "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n<｜DSML｜invoke "
       "name=\"b\">\n<｜DSML｜parameter name=\"k\" string=\"maybe\">v</｜DSML｜parameter>\n</｜DSML｜invoke>\n</"
       "｜DSML｜tool_calls>" + eos,
       "\n<｜DSML｜invoke name=\"b\">\n<｜DSML｜parameter name=\"k\" string=\"maybe\">v</｜DSML｜parameter>\n</"
       "｜DSML｜invoke>\n</｜DSML｜tool_calls>", 1},
      // Duplicate parameter.
      {false,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n<｜DSML｜parameter name=\"k\" string=\"true\">1</｜DSML｜"
       "parameter>\n<｜DSML｜parameter name=\"k\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</"
       "｜DSML｜tool_calls>" + eos,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n<｜DSML｜parameter name=\"k\" string=\"true\">1</｜DSML｜"
       "parameter>\n<｜DSML｜parameter name=\"k\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</"
       "｜DSML｜tool_calls>", 0},
      // Cut off inside an invoke (max_tokens).
      {false, "ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n<｜DSML｜parameter name=\"k\" str",
       "ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n<｜DSML｜parameter name=\"k\" str", 0},
      // Garbage inside the block.
      {false, "<｜DSML｜tool_calls>\nhello</｜DSML｜tool_calls>" + eos,
       "<｜DSML｜tool_calls>\nhello</｜DSML｜tool_calls>", 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    ParsedCompletion got = ParseDeepSeekV4Completion(c.text, Opts(c.thinking));
    EXPECT_EQ(got.content, c.content);
    EXPECT_EQ(got.tool_calls.size(), c.calls);
    EXPECT_FALSE(got.errors.empty());
    ExpectStreamingMatchesOneShot(c.text, c.thinking);
  }
}

TEST(DeepSeekV4OutputParserTest, EdgeCasesStreamConsistently) {
  const std::string eos = "<｜end▁of▁sentence｜>";
  const std::vector<std::pair<bool, std::string>> texts = {
      {true, "<think>repeated opener</think>answer" + eos},  // "<think>" repeated by the model is dropped
      {true, "<thin"},                                      // ends while it could still be "<think>"
      {true, "reasoning cut by max_tokens, no end marker </thi"},
      {false, "content ending in a partial marker \n\n<｜DSML｜tool_"},
      {false, "text\n\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
              "after the block" + eos},
      {false, "answer" + eos + "text after the end"},
      {true, "日本語の推論🧠</think>答え👨‍👩‍👧" + eos},
  };
  for (const auto& [thinking, text] : texts) {
    SCOPED_TRACE(text);
    ExpectStreamingMatchesOneShot(text, thinking);
  }
  ParsedCompletion p = ParseDeepSeekV4Completion(texts[0].second, Opts(true));
  EXPECT_EQ(p.reasoning_content, "repeated opener");
  EXPECT_EQ(p.content, "answer");
  p = ParseDeepSeekV4Completion(texts[2].second, Opts(true));
  EXPECT_EQ(p.reasoning_content, texts[2].second);
  p = ParseDeepSeekV4Completion(texts[4].second, Opts(false));
  EXPECT_EQ(p.content, "text\nafter the block");
  EXPECT_EQ(p.tool_calls.size(), 1u);
  p = ParseDeepSeekV4Completion(texts[5].second, Opts(false));
  EXPECT_EQ(p.content, "answer");
  EXPECT_EQ(p.errors.size(), 1u);  // text after EOS is reported, not returned
}

TEST(DeepSeekV4OutputParserTest, FinishReasonHintAndIds) {
  DeepSeekV4OutputParser parser({/*thinking=*/false, {}});
  parser.Feed("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n");
  EXPECT_STREQ(parser.FinishReasonHint(), "tool_calls");
  DeepSeekV4OutputParser plain({/*thinking=*/false, {}});
  std::vector<ChatOutputEvent> events = plain.Feed("hi<｜end▁of▁sentence｜>");
  EXPECT_STREQ(plain.FinishReasonHint(), "");
  EXPECT_TRUE(plain.saw_end_of_sentence());
  // Default ids: "call_" + 24 alphanumerics, distinct.
  ParsedCompletion two = ParseDeepSeekV4Completion(
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n</｜DSML｜"
      "invoke>\n</｜DSML｜tool_calls>",
      {false, {}});
  ASSERT_EQ(two.tool_calls.size(), 2u);
  EXPECT_EQ(two.tool_calls[0].id.size(), 29u);
  EXPECT_EQ(two.tool_calls[0].id.rfind("call_", 0), 0u);
  EXPECT_NE(two.tool_calls[0].id, two.tool_calls[1].id);
}

// The hard cases users report for DeepSeek-V4 output behind other servers. Each is checked one-shot
// against the expected split and, split at every byte (CJK and emoji included) and one byte at a time,
// against the one-shot result.
namespace hard {
const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kOpen = "<｜DSML｜tool_calls>\n";
const std::string kClose = "</｜DSML｜tool_calls>";
std::string Invoke(const std::string& name, const std::vector<std::tuple<std::string, bool, std::string>>& params) {
  std::string s = "<｜DSML｜invoke name=\"" + name + "\">\n";
  for (const auto& [k, is_string, v] : params)
    s += "<｜DSML｜parameter name=\"" + k + "\" string=\"" + (is_string ? "true" : "false") + "\">" + v +
         "</｜DSML｜parameter>\n";
  return s + "</｜DSML｜invoke>\n";
}
}  // namespace hard

// (a) max_tokens ran out before "</think>": all of it is reasoning, nothing is content, even when it
// ends in a piece of a marker or of a character.
TEST(DeepSeekV4OutputParserTest, ReasoningThatNeverCloses) {
  const std::vector<std::string> texts = {
      "I need to weigh 日本語 and 🧠 options; first, the <｜DSML｜invoke tag is only named here",
      "long reasoning that stops inside the end marker </thi",
      "stops inside a DSML opener \n\n<｜DSML｜tool_c",
      "stops inside the end of sentence <｜end▁of▁sen",
  };
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    ParsedCompletion p = ParseDeepSeekV4Completion(text, Opts(true));
    EXPECT_EQ(p.reasoning_content, text);
    EXPECT_EQ(p.content, "");
    EXPECT_TRUE(p.tool_calls.empty());
    ExpectStreamingMatchesOneShot(text, true);
  }
}

// (b) A tool-call block inside the reasoning (no "</think>" before it) ends the reasoning: its calls are
// tool calls, what follows is content, a "</think>" after the block is dropped. A malformed block there
// falls back to content like anywhere else.
TEST(DeepSeekV4OutputParserTest, ToolCallsInsideReasoning) {
  using namespace hard;
  const std::string call = Invoke("get_weather", {{"city", true, "Paris"}, {"days", false, "3"}});
  struct Case {
    std::string text, reasoning, content;
    size_t calls;
    bool errors;
  };
  const std::vector<Case> cases = {
      {"I should look it up.\n\n" + kOpen + call + kClose + kEos, "I should look it up.", "", 1, false},
      {"No separator." + kOpen + call + kClose + kEos, "No separator.", "", 1, false},
      {"Call first.\n\n" + kOpen + call + kClose + " then text</think>Answer." + kEos, "Call first.",
       " then textAnswer.", 1, false},
      {"Bad block.\n\n" + kOpen + "<｜DSML｜invoke name=oops>\n" + kClose + kEos, "Bad block.",
       "\n\n" + kOpen + "<｜DSML｜invoke name=oops>\n" + kClose, 0, true},
      // A closed reasoning keeps the usual rule: the block after "</think>" is the answer's.
      {"Thought.</think>Calling.\n\n" + kOpen + call + kClose + kEos, "Thought.", "Calling.", 1, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    ParsedCompletion p = ParseDeepSeekV4Completion(c.text, Opts(true));
    EXPECT_EQ(p.reasoning_content, c.reasoning);
    EXPECT_EQ(p.content, c.content);
    ASSERT_EQ(p.tool_calls.size(), c.calls);
    if (c.calls) {
      EXPECT_EQ(p.tool_calls[0].name, "get_weather");
      EXPECT_EQ(p.tool_calls[0].arguments, R"({"city": "Paris", "days": 3})");
    }
    EXPECT_EQ(!p.errors.empty(), c.errors);
    ExpectStreamingMatchesOneShot(c.text, true);
  }
}

// (c) Several calls in one block, the way V4 writes parallel calls, with every kind of value.
TEST(DeepSeekV4OutputParserTest, ParallelCallsInOneBlock) {
  using namespace hard;
  const std::string text =
      "Three lookups.\n\n" + kOpen + Invoke("get_weather", {{"city", true, "東京"}, {"days", false, "2"}}) +
      Invoke("get_weather", {{"city", true, "Zürich 🏔"}, {"units", true, "metric"}}) +
      Invoke("search", {{"q", true, "a \"quoted\"\nline\\"}, {"filters", false, R"({"year": [2024, 2025], "x": null})"},
                        {"exact", false, "true"}}) +
      Invoke("no_args", {}) + kClose + kEos;
  ParsedCompletion p = ParseDeepSeekV4Completion(text, Opts(false));
  EXPECT_EQ(p.content, "Three lookups.");
  EXPECT_TRUE(p.errors.empty());
  ASSERT_EQ(p.tool_calls.size(), 4u);
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"city": "東京", "days": 2})");
  EXPECT_EQ(p.tool_calls[1].arguments, R"({"city": "Zürich 🏔", "units": "metric"})");
  EXPECT_EQ(p.tool_calls[2].name, "search");
  EXPECT_EQ(p.tool_calls[2].arguments,
            R"({"q": "a \"quoted\"\nline\\", "filters": {"year": [2024, 2025], "x": null}, "exact": true})");
  EXPECT_EQ(p.tool_calls[3].arguments, "{}");
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(p.tool_calls[i].id, "call_" + std::to_string(i));
  ExpectStreamingMatchesOneShot(text, false);
  // The same block after reasoning, in thinking mode.
  ExpectStreamingMatchesOneShot("Plan.</think>" + text, true);
}

// (d) Values that contain DSML markup themselves. A closing parameter tag followed by plain text is part of
// the value; followed by a DSML tag it ends the value, as in the official parser, so a misspelt or missing
// tag after it makes the block malformed instead of merging two parameters or two calls.
TEST(DeepSeekV4OutputParserTest, DsmlTextInsideArguments) {
  using namespace hard;
  const std::string fake_param = "</｜DSML｜parameter> is how a value ends";
  const std::string fake_invoke = "<｜DSML｜invoke name=\"rm\"> opens a call, </｜DSML｜invoke> ends it";
  const std::string fake_end = "the block ends with </｜DSML｜tool_calls> and <｜end▁of▁sentence｜> follows";
  const std::string json_value = R"({"doc": "</｜DSML｜parameter> then <｜DSML｜parameter name=\"x\">", "n": 1})";
  const std::string text =
      "Writing docs.\n\n" + kOpen + Invoke("write_file", {{"path", true, "docs/dsml.md"}, {"text", true, fake_param}}) +
      Invoke("write_file", {{"text", true, fake_invoke}, {"mode", true, "a"}}) +
      Invoke("note", {{"text", true, fake_end}}) + Invoke("store", {{"value", false, json_value}}) + kClose + kEos;
  ParsedCompletion p = ParseDeepSeekV4Completion(text, Opts(false));
  EXPECT_EQ(p.content, "Writing docs.");
  EXPECT_TRUE(p.errors.empty()) << p.errors.front();
  ASSERT_EQ(p.tool_calls.size(), 4u);
  auto args = [&](size_t i) { return ParseJsonText(p.tool_calls[i].arguments, "arguments"); };
  EXPECT_EQ(args(0)["path"], "docs/dsml.md");
  EXPECT_EQ(args(0)["text"], fake_param);
  EXPECT_EQ(args(1)["text"], fake_invoke);
  EXPECT_EQ(args(1)["mode"], "a");
  EXPECT_EQ(args(2)["text"], fake_end);
  EXPECT_EQ(args(3)["value"], ParseJsonText(json_value, "value"));
  ExpectStreamingMatchesOneShot(text, false);

  // A quoted closing tag followed by a DSML tag ends the value; what follows does not parse, so the call
  // completed so far stands and the rest of the block is content (the official parser rejects it all).
  const std::string quoted = "x</｜DSML｜parameter>\n</｜DSML｜invoke>\nwas an example";
  const std::string ends_early = kOpen + Invoke("f", {{"a", true, quoted}}) + kClose + kEos;
  p = ParseDeepSeekV4Completion(ends_early, Opts(false));
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"a": "x"})");
  EXPECT_EQ(p.content, "\nwas an example</｜DSML｜parameter>\n</｜DSML｜invoke>\n" + kClose);
  EXPECT_EQ(p.malformed_blocks, 1u);
  ExpectStreamingMatchesOneShot(ends_early, false);

  // The model ends with EOS instead of the block's closing tag: the call stands, the missing end is
  // reported (not a malformed block: nothing of it is content).
  const std::string unclosed = kOpen + Invoke("f", {{"a", true, "x</｜DSML｜parameter>y"}}) + kEos;
  p = ParseDeepSeekV4Completion(unclosed, Opts(false));
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"a": "x</｜DSML｜parameter>y"})");
  EXPECT_EQ(p.content, "");
  EXPECT_EQ(p.errors.size(), 1u);
  EXPECT_EQ(p.malformed_blocks, 0u);
  ExpectStreamingMatchesOneShot(unclosed, false);

  // Cut off by max_tokens inside such a value: nothing is a call, the text is content.
  const std::string cut = "x\n\n" + kOpen + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
                          "string=\"true\">v</｜DSML｜parameter> and more";
  p = ParseDeepSeekV4Completion(cut, Opts(false));
  EXPECT_TRUE(p.tool_calls.empty());
  EXPECT_EQ(p.content, cut);
  ExpectStreamingMatchesOneShot(cut, false);
}

// Tool calls off (tool_choice "none", no tools): blocks, well-formed or not, and stray DSML tags outside a
// block are removed; the text around them is returned; nothing else changes.
TEST(DeepSeekV4OutputParserTest, ToolCallsOffRemoveEveryDsmlTag) {
  using namespace hard;
  const std::string call = Invoke("get_weather", {{"city", true, "Paris"}});
  struct Case {
    bool thinking;
    std::string text, reasoning, content;
    size_t suppressed, malformed;
  };
  const std::vector<Case> cases = {
      {false, "Sure.\n\n" + kOpen + call + call + kClose + " Done." + kEos, "", "Sure. Done.", 2, 0},
      {true, "Plan.</think>Stray <｜DSML｜invoke name=\"x\"> and </｜DSML｜parameter> tags." + kEos, "Plan.",
       "Stray  and  tags.", 0, 0},
      {true, "Thinking about <｜DSML｜parameter name=\"k\" string=\"true\">.</think>Answer." + kEos, "Thinking about .",
       "Answer.", 0, 0},
      {false, "A stray tag cut at the line end <｜DSML｜invoke name=\"x\"\nnext line" + kEos, "",
       "A stray tag cut at the line end \nnext line", 0, 0},
      {false, "Broken:\n\n" + kOpen + "<｜DSML｜invoke name=bad>\n</｜DSML｜invoke>\n" + kClose + " after." + kEos, "",
       "Broken: after.", 0, 1},
      {false, "Cut:\n\n" + kOpen + call + "<｜DSML｜invoke name=\"g\">\n<｜DSML｜param", "", "Cut:", 1, 1},
      {true, "Call in reasoning.\n\n" + kOpen + call + kClose + "</think>Answer." + kEos, "Call in reasoning.",
       "Answer.", 1, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    ParsedCompletion p = ParseDeepSeekV4Completion(c.text, Opts(c.thinking, /*tool_calls=*/false));
    EXPECT_EQ(p.reasoning_content, c.reasoning);
    EXPECT_EQ(p.content, c.content);
    EXPECT_TRUE(p.tool_calls.empty());
    EXPECT_EQ(p.suppressed_calls, c.suppressed);
    EXPECT_EQ(p.malformed_blocks, c.malformed);
    ExpectStreamingMatchesOneShot(c.text, c.thinking, /*tool_calls=*/false);
  }
}

// What the renderer writes for an assistant's tool calls parses back to the same arguments.
TEST(DeepSeekV4OutputParserTest, RenderedToolCallsParseBack) {
  std::vector<ChatToolCall> calls = {
      {"a", "function", "search", R"({"query": "weather \"today\"\n", "n": 3, "x": [1, 2.5, null], "o": {"k": true}})"},
      {"b", "function", "noargs", "{}"},
      {"c", "function", "uni", R"({"text": "日本語 😀 \u0001", "neg": -0.0, "big": 1e300})"},
  };
  std::string text = "\n\n" + RenderDeepSeekV4ToolCalls(calls, "test") + "<｜end▁of▁sentence｜>";
  ParsedCompletion got = ParseDeepSeekV4Completion(text, Opts(false));
  EXPECT_EQ(got.content, "");
  ASSERT_EQ(got.tool_calls.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, calls[i].name);
    EXPECT_EQ(ParseJsonText(got.tool_calls[i].arguments, "parsed"), ParseJsonText(calls[i].arguments, "original"));
  }
  ExpectStreamingMatchesOneShot(text, false);
}

}  // namespace
}  // namespace dsmesh

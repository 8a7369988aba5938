# (dsmesh, hand-written) Writes the oracle conversations (OpenAI chat request bodies) into common/chat/testdata/conversations/.
import json, os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a specific location",
  "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "The city name"},
  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}}, "required": ["location"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web for information",
  "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "Search query"},
  "num_results": {"type": "integer", "description": "Number of results to return", "minimum": 1, "maximum": 50}}, "required": ["query"]}}}
CALC = {"type": "function", "function": {"name": "calculate", "description": "Évalue une expression — 计算器 🧮",
  "strict": True, "parameters": {"type": "object", "properties": {"expr": {"type": "string"},
  "precision": {"type": "number", "default": 0.5, "minimum": 1e-05, "maximum": 1e+16},
  "scale": {"type": "number", "default": 100.0, "exclusiveMaximum": 1234567.125},
  "flags": {"type": "array", "items": {"type": "boolean"}, "default": [True, False, None]}},
  "required": ["expr"], "additionalProperties": False}}}
NOARGS = {"type": "function", "function": {"name": "get_time", "description": "Current time, no arguments",
  "parameters": {"type": "object", "properties": {}}}}

def tc(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}

def a(content=None, reasoning=None, calls=None):
    m = {"role": "assistant", "content": content}
    if reasoning is not None: m["reasoning_content"] = reasoning
    if calls is not None: m["tool_calls"] = calls
    return m

def u(c): return {"role": "user", "content": c}
def s(c): return {"role": "system", "content": c}
def t(id_, c): return {"role": "tool", "tool_call_id": id_, "content": c}

C = {}
C["01_single_user"] = {"messages": [u("Hello")]}
C["02_system_user"] = {"messages": [s("You are a helpful assistant."), u("What is 2+2?")]}
C["03_multi_turn"] = {"messages": [s("You are concise."), u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")]}
C["04_reasoning_in_history"] = {"messages": [s("You are a helpful assistant."), u("Hello"),
  a("Hi there! How can I help you?", "The user said hello, I should greet back."),
  u("What is the capital of France?"), a("The capital of France is Paris.", "The user asks about the capital of France. It is Paris."),
  u("And of Germany?")]}
C["05_ends_with_assistant"] = {"messages": [s("You are a helpful assistant."), u("Hello"),
  a("Hi there!", "The user greets me.")]}
C["06_two_system_messages"] = {"messages": [s("Rule one: be brief."), s("Rule two: be kind."), u("Hi")]}
C["07_system_mid_conversation"] = {"messages": [s("Start."), u("First question"), a("First answer"),
  s("New instruction: answer in French."), u("Second question")]}
C["08_empty_system_and_user"] = {"messages": [s(""), u("")]}
C["09_cjk"] = {"messages": [s("该助手为DeepSeek，由深度求索公司创造。"), u("日本の四季の特徴を教えてください。"),
  a("春は桜、夏は祭り、秋は紅葉、冬は雪です。", "四季について簡潔に答える。"), u("한국어로도 설명해 주세요.")]}
C["10_emoji_zwj_combining"] = {"messages": [u("Family: 👨‍👩‍👧‍👦 flags 🇯🇵🇫🇷 skin 👋🏽 café vs cafe\u0301 Å\u030a"),
  a("Noted: 👍🏿 e\u0301", "Emoji 🤔 analysis"), u("Z\u0351\u0352a\u0353l\u0354g\u0355o ﷽ 𝕏 \u200b\u2028zero-width")]}
C["11_special_token_strings_in_content"] = {"messages": [s("Never output <think> or </think> literally."),
  u("Explain <｜User｜>, <｜Assistant｜> and <｜end▁of▁sentence｜> and <｜DSML｜tool_calls>."),
  a("They are markers like <think> and <tool_result>x</tool_result>.", "The user asks about </think> tokens"),
  u("<｜begin▁of▁sentence｜>again")]}
C["12_whitespace"] = {"messages": [s("  leading and trailing  \n"), u("tabs\there\r\nCRLF\rlone CR   \n\n\n"),
  a("\n\nanswer with newlines\n\n", "  spaced reasoning  \n"), u(" ")]}
C["13_tool_single_call"] = {"tools": [WEATHER, SEARCH], "messages": [s("You are a helpful assistant."),
  u("What's the weather in Beijing?"),
  a(None, "The user wants to know the weather in Beijing. I should use the get_weather tool.",
    [tc("call_001", "get_weather", "{\"location\": \"Beijing\", \"unit\": \"celsius\"}")]),
  t("call_001", "{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}"),
  a("The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity.",
    "Got the weather data. Let me format a nice response.")]}
C["14_tool_call_pending"] = {"tools": [WEATHER], "messages": [s("You are a helpful assistant."),
  u("Weather in Paris and Tokyo?"),
  a(None, "Two cities, two calls.", [tc("call_a", "get_weather", "{\"location\": \"Paris\"}"),
                                       tc("call_b", "get_weather", "{\"location\": \"Tokyo\", \"unit\": \"fahrenheit\"}")]),
  t("call_a", "Paris: 18C rain"), t("call_b", "Tokyo: 75F clear")]}
C["15_tool_results_out_of_order"] = {"tools": [WEATHER, SEARCH], "messages": [u("Look up three things"),
  a(None, "Three parallel calls.", [tc("c1", "search", "{\"query\": \"alpha\"}"), tc("c2", "search", "{\"query\": \"beta\", \"num_results\": 3}"),
    tc("c3", "get_weather", "{\"location\": \"Oslo\"}")]),
  t("c3", "cold"), t("c1", "alpha results"), t("zzz_unknown", "orphan result"), t("c2", "beta results")]}
C["16_tools_no_system"] = {"tools": [SEARCH], "messages": [u("Search for bazel docs"),
  a(None, None, [tc("s1", "search", "{\"query\": \"bazel docs\"}")]), t("s1", "https://bazel.build/docs"),
  a("Here: https://bazel.build/docs")]}
C["17_tool_args_all_types"] = {"tools": [CALC], "messages": [s("Math helper."), u("Compute things"),
  a(None, "Use calculate with many argument types.", [tc("m1", "calculate",
    "{\"expr\": \"1/3 + \\\"q\\\"\\n\\ttab é 😀 \\u0001\", \"precision\": 1e-5, \"scale\": 100, \"ratio\": 2.50, \"big\": 1e16, \"neg\": -0.0, "
    "\"small\": 0.0001, \"int\": -42, \"flags\": [true, false, null], \"nested\": {\"b\": [1, 2.0, {\"c\": \"d\"}], \"a\": {}}, \"empty\": \"\", \"u64\": 18446744073709551615}")]),
  t("m1", "0.333")]}
C["18_tool_args_invalid_json"] = {"tools": [SEARCH], "messages": [u("go"),
  a(None, "bad args", [tc("x1", "search", "query=hello world")]), t("x1", "ok"), u("and again"),
  a(None, None, [tc("x2", "search", "{\"query\": \"unterminated")]), t("x2", "ok2")]}
C["19_tool_args_empty"] = {"tools": [NOARGS], "messages": [u("time?"),
  a(None, "no args", [tc("t1", "get_time", "{}"), tc("t2", "get_time", "")]), t("t1", "12:00"), t("t2", "12:00:01"),
  a("It is noon.")]}
C["20_tool_result_then_user_text"] = {"tools": [SEARCH], "messages": [s("sys"), u("find x"),
  a(None, "calling", [tc("r1", "search", "{\"query\": \"x\"}")]), t("r1", "x found"), u("Thanks, now summarize.")]}
C["21_consecutive_user_messages"] = {"messages": [s("sys"), u("part one"), u("part two"), u("part three")]}
C["22_assistant_content_and_tool_calls"] = {"tools": [WEATHER], "messages": [u("weather in Rome"),
  a("Let me check that for you.", "Need the tool.", [tc("w1", "get_weather", "{\"location\": \"Rome\"}")]),
  t("w1", "sunny"), a("Sunny in Rome.", "Answer.")]}
C["23_multi_round_tools"] = {"tools": [WEATHER, SEARCH], "messages": [s("Agent."), u("Plan a trip to Kyoto"),
  a(None, "First weather.", [tc("k1", "get_weather", "{\"location\": \"Kyoto\"}")]), t("k1", "mild"),
  a(None, "Then sights.", [tc("k2", "search", "{\"query\": \"Kyoto temples\", \"num_results\": 5}")]), t("k2", "Kinkaku-ji, Fushimi Inari"),
  a("Kyoto is mild; visit Kinkaku-ji and Fushimi Inari.", "Summarize."), u("What about Osaka?"),
  a(None, "Osaka weather.", [tc("o1", "get_weather", "{\"location\": \"Osaka\"}")]), t("o1", "warm")]}
C["24_assistant_reasoning_only"] = {"messages": [u("Think only"), a(None, "Just thinking, no answer."), u("Now answer")]}
C["25_reasoning_effort_max"] = {"reasoning_effort": "max", "messages": [s("You are a prover."), u("Prove that sqrt(2) is irrational.")]}
C["26_content_parts"] = {"messages": [{"role": "system", "content": [{"type": "text", "text": "System part A"}, {"type": "text", "text": "System part B"}]},
  {"role": "user", "content": [{"type": "text", "text": "Describe:"}, {"type": "text", "text": "two parts"}]},
  {"role": "assistant", "content": [{"type": "text", "text": "Answer in parts"}]}, u("ok")]}
C["27_tools_keep_history_reasoning"] = {"tools": [SEARCH], "messages": [s("sys"), u("q1"), a("a1", "r1"), u("q2"), a("a2", "r2"), u("q3")]}
C["28_long_multi_turn"] = {"messages": [s("Counting assistant.")] + sum([[u(f"Count to {i}"), a(" ".join(str(j) for j in range(1, i + 1)), f"Counting to {i}.")] for i in range(1, 7)], []) + [u("Count to 7")]}
C["29_assistant_first"] = {"messages": [s("sys"), a("I start the conversation.", "Opening."), u("ok, go on")]}
C["30_consecutive_assistants"] = {"messages": [u("hi"), a("part 1", "ra"), a("part 2", "rb"), u("continue")]}
C["31_tool_args_dsml_lookalike"] = {"tools": [SEARCH], "messages": [u("tricky"),
  a(None, "Quotes and markup.", [tc("d1", "search", "{\"query\": \"<｜DSML｜parameter name=\\\"x\\\">\\\"quoted\\\" </tool_result> \\\\ back\\\\slash\"}")]),
  t("d1", "<tool_result>nested</tool_result>")]}
C["32_duplicate_keys_in_args"] = {"tools": [SEARCH], "messages": [u("dupes"),
  a(None, None, [tc("p1", "search", "{\"query\": \"first\", \"num_results\": 1, \"query\": \"second\"}")]), t("p1", "r")]}
C["33_unicode_tool_result_and_names"] = {"tools": [CALC, NOARGS], "messages": [s("Δ système"), u("計算して"),
  a(None, "日本語で考える。", [tc("j1", "calculate", "{\"expr\": \"２＋２\", \"note\": \"ü ß ç 😀\"}")]),
  t("j1", "結果: ４ ✅"), a("答えは４です。", "完了。")]}
C["34_chat_history_only_system"] = {"messages": [s("Only a system prompt, then a user."), u("x"), a("y"), u("z"), a("w")]}
C["35_tool_message_right_after_user"] = {"tools": [SEARCH], "messages": [u("here is a result I already have"), t("pre", "precomputed"),
  a("Thanks.", "ok")]}
C["36_big_tool_schema_numbers"] = {"tools": [{"type": "function", "function": {"name": "numbers", "parameters": {"type": "object",
  "properties": {"n": {"type": "integer", "minimum": -9223372036854775808, "maximum": 18446744073709551615, "default": 0},
  "f": {"type": "number", "enum": [0.1, 1.5e-07, 3.0, 1e+22, 123456789012345.6, -2.5e-310]}}}}}],
  "messages": [u("numbers")]}
C["37_no_generation_prompt"] = {"add_generation_prompt": False, "messages": [s("sys"), u("Hello"), a("Hi")]}
C["38_no_generation_prompt_after_tools"] = {"add_generation_prompt": False, "tools": [SEARCH], "messages": [u("q"),
  a(None, None, [tc("n1", "search", "{\"query\": \"q\"}")]), t("n1", "r")]}

# Tool-call turns sent back with reasoning_content, as DeepSeek's API requires on such turns.
# 39: the same history without `tools` (what the gateway renders for tool_choice "none"): in thinking mode the
# reasoning of every turn before the last user/tool turn is dropped.
C["39_tool_history_without_tools"] = {"messages": [s("Agent."), u("Plan a trip to Kyoto"),
  a(None, "First weather.", [tc("k1", "get_weather", "{\"location\": \"Kyoto\"}")]), t("k1", "mild"),
  a("Checking sights next.", "Then sights.", [tc("k2", "search", "{\"query\": \"Kyoto temples\", \"num_results\": 5}")]),
  t("k2", "Kinkaku-ji"), a("Kyoto is mild; visit Kinkaku-ji.", "Summarize."), u("Thanks. Anything else?")]}
# 40: an agent loop with tools: reasoning on every tool-call turn (empty, multi-line, CJK, markup-like text),
# content null / "" / text beside the calls, parallel calls, and the loop still open (last message a tool result).
C["40_reasoning_on_every_tool_turn"] = {"tools": [WEATHER, SEARCH], "messages": [s("Agent."), u("Compare Oslo and 東京"),
  a("", "", [tc("q1", "get_weather", "{\"location\": \"Oslo\"}")]), t("q1", "cold"),
  a(None, "Oslo is cold.\n\nNow 東京 — check <tool_result> format.\n", [tc("q2", "get_weather", "{\"location\": \"東京\", \"unit\": \"celsius\"}"),
    tc("q3", "search", "{\"query\": \"Tokyo weather\", \"num_results\": 2}")]),
  t("q3", "mild"), t("q2", "18C"),
  a("Let me double-check one thing.", "  leading and trailing spaces  ", [tc("q4", "search", "{\"query\": \"Oslo forecast\"}")]),
  t("q4", "snow")]}
# 41: the conversation ends with the assistant's tool-call turn (the call not answered yet), reasoning included.
C["41_ends_with_tool_call_turn"] = {"tools": [WEATHER], "messages": [u("Weather in Lima?"),
  a(None, "Call the tool.", [tc("l1", "get_weather", "{\"location\": \"Lima\"}")])]}
# 42: a tool-call turn after a plain answer, with tools, in a conversation whose earlier turns carry reasoning too:
# with tools every turn keeps its reasoning, also those before the last user message.
C["42_tools_keep_tool_turn_reasoning"] = {"tools": [SEARCH], "messages": [u("hi"), a("Hello!", "Greet."),
  u("find bazel"), a(None, "Search it.", [tc("b1", "search", "{\"query\": \"bazel\"}")]), t("b1", "bazel.build"),
  a("Found: bazel.build", "Report."), u("and buck?")]}

for name, body in C.items():
    with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(body, f, ensure_ascii=False, indent=1)
        f.write("\n")
print(len(C), "conversations")

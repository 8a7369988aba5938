# Runs the official parse_message_from_completion_text over sample completions and writes the expected
# results (common/chat/testdata/v4_parse/official_parse.json). See common/chat/testdata/README.md.
import json, os, sys
sys.path.insert(0, sys.argv[1])
from encoding_dsv4 import parse_message_from_completion_text, encode_messages
out_path = sys.argv[2]
EOS = "<｜end▁of▁sentence｜>"
D = "｜DSML｜"

def block(*invokes):
    return f"\n\n<{D}tool_calls>\n" + "\n".join(invokes) + f"\n</{D}tool_calls>"

def invoke(name, *params):
    body = "\n".join(f'<{D}parameter name="{k}" string="{s}">{v}</{D}parameter>' for k, s, v in params)
    return f'<{D}invoke name="{name}">\n{body}\n</{D}invoke>'

samples = [
  ("thinking", "Simple arithmetic.</think>2 + 2 = 4." + EOS),
  ("thinking", "</think>No reasoning at all." + EOS),
  ("thinking", "Multi\nline\n\nreasoning with 日本語 and emoji 👨‍👩‍👧.</think>\n\nAnswer after blank lines.\n\n" + EOS),
  ("thinking", "Empty answer.</think>" + EOS),
  ("chat", "Plain chat answer with <tags> and </think-like> text." + EOS),
  ("chat", "" + EOS),
  ("thinking", "I need the weather.</think>" + block(invoke("get_weather", ("location", "true", "Beijing"), ("unit", "true", "celsius"))) + EOS),
  ("thinking", "Two calls.</think>Checking both." + block(
      invoke("search", ("query", "true", "alpha \"quoted\" \\ back\nslash\ttab"), ("num_results", "false", "3")),
      invoke("calculate", ("expr", "true", "２＋２ 😀"), ("precision", "false", "1e-05"), ("flags", "false", "[true, false, null]"),
          ("nested", "false", '{"b": [1, 2.0, {"c": "d"}], "a": {}}'), ("empty", "true", ""))) + EOS),
  ("chat", block(invoke("get_time")) + EOS),
  ("chat", "Content first." + block(invoke("search", ("query", "true", "x < y > z")), invoke("get_time")) + EOS),
  ("thinking", "Raw JSON value kept verbatim.</think>" + block(invoke("f", ("v", "false", "not json at all"), ("w", "false", " 12 "))) + EOS),
  ("thinking", "Value with markup.</think>" + block(invoke("f", ("html", "true", "<b>bold</b> <tool_result>x</tool_result>"), ("multi", "true", "line1\nline2\n"))) + EOS),
]
# Assistant turns cut out of the official encoder's own prompts (as DeepSeek's test does).
conv_dir = sys.argv[3]
for name in ["13_tool_single_call", "23_multi_round_tools", "17_tool_args_all_types", "33_unicode_tool_result_and_names", "31_tool_args_dsml_lookalike", "19_tool_args_empty"]:
    prompt = open(os.path.join(sys.argv[4], name + ".thinking.txt"), encoding="utf-8").read()
    marker = "<｜Assistant｜><think>"
    pos = 0
    while True:
        start = prompt.find(marker, pos)
        if start < 0: break
        start += len(marker)
        end = prompt.find(EOS, start)
        if end < 0: break
        samples.append(("thinking", prompt[start:end + len(EOS)]))
        pos = end

results = []
for mode, text in samples:
    parsed = parse_message_from_completion_text(text, thinking_mode=mode)
    results.append({"thinking": mode == "thinking", "completion": text, "expected": {
        "reasoning_content": parsed["reasoning_content"], "content": parsed["content"],
        "tool_calls": [{"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]} for tc in parsed["tool_calls"]]}})
os.makedirs(os.path.dirname(out_path), exist_ok=True)
with open(out_path, "w", encoding="utf-8") as f:
    json.dump(results, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(len(results), "samples")

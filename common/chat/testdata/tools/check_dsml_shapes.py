# (dsmesh, hand-written) Runs DeepSeek's official parse_message_from_completion_text (encoding_dsv4.py, fetched
# to /tmp, never committed) over the well-formed DSML shapes //gateway:dsml_shapes_test generates, and checks
# that the split the generator expects (reasoning, content, tool calls with their arguments) is what the
# official parser returns. See common/chat/testdata/README.md.
import json, sys
sys.path.insert(0, sys.argv[1])  # directory holding encoding_dsv4.py
from encoding_dsv4 import parse_message_from_completion_text

shapes = json.load(open(sys.argv[2], encoding="utf-8"))
def strict_json(text):
    def no_constant(name):
        raise ValueError(name)
    try:
        return isinstance(json.loads(text, parse_constant=no_constant), dict)
    except ValueError:
        return False

def unusable(call):
    if not call["name"] or not strict_json(call["arguments"]):
        return True
    return any('"' in k for k in json.loads(call["arguments"]))

bad = unusable_count = 0
official = [s for s in shapes if s["kind"] == "official"]
for s in shapes:
    if s["kind"] == "official":
        continue
    try:
        got = parse_message_from_completion_text(s["text"], thinking_mode="thinking" if s["thinking"] else "chat")
    except (AssertionError, ValueError):
        continue
    if s["kind"] == "broken" and any(unusable(c["function"]) for c in got["tool_calls"]):
        unusable_count += 1
        continue
    bad += 1
    print("ACCEPTED", s["kind"], s["description"], json.dumps(s["text"], ensure_ascii=False))
for s in official:
    got = parse_message_from_completion_text(s["text"], thinking_mode="thinking" if s["thinking"] else "chat")
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in got["tool_calls"]]
    want = {"reasoning_content": s["reasoning_content"], "content": s["content"], "tool_calls": s["tool_calls"]}
    have = {"reasoning_content": got["reasoning_content"], "content": got["content"], "tool_calls": calls}
    if have != want:
        bad += 1
        print("MISMATCH", s["description"], json.dumps(s["text"], ensure_ascii=False))
        print("  want", json.dumps(want, ensure_ascii=False))
        print("  got ", json.dumps(have, ensure_ascii=False))
    for c in calls:  # the arguments the official parser builds are JSON
        json.loads(c["arguments"])
print(f"{len(shapes)} shapes, {len(official)} official; {unusable_count} broken ones the official parser turns "
      f"into unusable calls, the other non-official ones it rejects; {bad} not as expected")
sys.exit(1 if bad else 0)

# Runs DeepSeek's official encoder (encoding_dsv4.py, fetched to /tmp, never committed) over every
# conversation and writes the expected prompts. See common/chat/testdata/README.md.
import copy, glob, json, os, sys
sys.path.insert(0, sys.argv[1])          # directory holding encoding_dsv4.py
from encoding_dsv4 import encode_messages
conv_dir, out_dir = sys.argv[2], sys.argv[3]
os.makedirs(out_dir, exist_ok=True)

def flatten(content):
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content)
    return content

n = 0
for path in sorted(glob.glob(os.path.join(conv_dir, "*.json"))):
    name = os.path.basename(path)[:-5]
    body = json.load(open(path, encoding="utf-8"))
    if body.get("add_generation_prompt") is False:
        continue  # the V4 format has no such switch; dsmesh refuses these requests
    messages = []
    for m in body["messages"]:
        m = copy.deepcopy(m)
        if "content" in m:
            m["content"] = flatten(m["content"])
        messages.append(m)
    tools = body.get("tools") or []
    if tools:
        if messages[0]["role"] == "system":
            messages[0]["tools"] = tools
        else:
            messages.insert(0, {"role": "system", "tools": tools})
    effort = "max" if body.get("reasoning_effort") == "max" else None
    for mode in ("thinking", "chat"):
        prompt = encode_messages(copy.deepcopy(messages), thinking_mode=mode, reasoning_effort=effort)
        with open(os.path.join(out_dir, f"{name}.{mode}.txt"), "w", encoding="utf-8", newline="") as f:
            f.write(prompt)
        n += 1
print(n, "prompts written")

#!/usr/bin/env python3
"""Oracle for deepseek_v3_prompt_test: renders each conversation with python3-jinja2 and the real
DeepSeek-V3 chat_template string, the way transformers' apply_chat_template does (sandboxed
environment, trim_blocks, lstrip_blocks, bos_token/eos_token from tokenizer_config.json).

usage: render_v3_jinja.py TOKENIZER_CONFIG_JSON CONVERSATION.json...
prints one JSON object: {file name: {"prompt": text} or {"error": message}}
"""
import json
import os
import sys

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def token_text(tok):
    return tok["content"] if isinstance(tok, dict) else tok


def flatten(content):
    # The gateway joins text parts with "\n" before templating (as vLLM does).
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content)
    return content


def main():
    config = json.load(open(sys.argv[1], encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    template = env.from_string(config["chat_template"])
    results = {}
    for path in sys.argv[2:]:
        body = json.load(open(path, encoding="utf-8"))
        messages = []
        for m in body["messages"]:
            m = dict(m)
            if "content" in m:
                m["content"] = flatten(m["content"])
            messages.append(m)
        try:
            prompt = template.render(
                messages=messages,
                tools=body.get("tools"),
                add_generation_prompt=body.get("add_generation_prompt", True),
                bos_token=token_text(config["bos_token"]),
                eos_token=token_text(config["eos_token"]),
            )
            results[os.path.basename(path)] = {"prompt": prompt}
        except Exception as e:  # the C++ renderer must refuse the same inputs
            results[os.path.basename(path)] = {"error": f"{type(e).__name__}: {e}"}
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()

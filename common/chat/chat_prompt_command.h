// `dsmesh chat-prompt`: renders a conversation file with a chat format and tokenizes the prompt.
//
//   dsmesh chat-prompt --tokenizer DIR --messages FILE.json [--thinking true|false] [--tools FILE.json]
//                      [--format v4|v3] [--add-generation-prompt true|false]
//
// FILE.json is either a messages array or a whole chat-completions request body (messages, tools,
// chat_template_kwargs, reasoning_effort). --tools takes a tools array (or a body with "tools").
// Without --format the format comes from DIR/config.json's model_type, else v4.
// Prints {"prompt": "...", "ids": [...]} (ids without any BOS added: the prompt already holds it).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsmesh {

// The command's output object. Throws UsageError for bad flags, std::runtime_error naming the file
// for bad input.
nlohmann::ordered_json ChatPromptCommandOutput(const std::vector<std::string>& args);

// The command (cli/commands.cc): prints ChatPromptCommandOutput as one JSON line.
int RunChatPrompt(const std::vector<std::string>& args);

}  // namespace dsmesh

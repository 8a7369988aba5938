#include "common/chat/chat_prompt_command.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "common/chat/chat_format.h"
#include "common/chat/chat_request_parser.h"
#include "common/chat/python_json.h"
#include "common/flags.h"
#include "common/model_card.h"
#include "common/tokenizer/tokenizer.h"

namespace dsmesh {
namespace {

using Json = nlohmann::ordered_json;

Json ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return ParseJsonText(text.str(), path);
}

// The chat format a model directory asks for through its config.json's model_type (common/model_card.h), if
// the directory has a config.json.
std::optional<ChatFormat> FormatFromModelDir(const std::string& tokenizer_arg) {
  std::filesystem::path dir(tokenizer_arg);
  if (!std::filesystem::is_directory(dir)) dir = dir.parent_path();
  if (dir.empty()) dir = ".";  // a bare tokenizer.json: the working directory
  if (!std::filesystem::exists(dir / "config.json")) return std::nullopt;
  const ModelCard card = ModelCard::FromDirectory(dir.string());
  if (card.model_type.empty()) throw std::runtime_error(card.source + ": no model_type; pass --format v4|v3");
  auto format = ChatFormatForModelType(card.model_type);
  if (!format)
    throw std::runtime_error(card.source + ": model_type '" + card.model_type +
                             "' has no chat format here; pass --format v4|v3");
  return format;
}

}  // namespace

nlohmann::ordered_json ChatPromptCommandOutput(const std::vector<std::string>& args) {
  const Flags flags(args, {"tokenizer", "messages", "thinking", "tools", "format", "add-generation-prompt"});
  if (!flags.positional().empty()) throw UsageError("unexpected argument '" + flags.positional()[0] + "'");
  const std::string tokenizer_arg = flags.Require("tokenizer");
  const std::string messages_path = flags.Require("messages");
  // Flag values are checked before any file is read, so a typo is reported as such.
  std::optional<bool> thinking, add_generation_prompt;
  if (flags.Has("thinking")) thinking = flags.GetBool("thinking", true);
  if (flags.Has("add-generation-prompt")) add_generation_prompt = flags.GetBool("add-generation-prompt", true);

  ChatFormat format = ChatFormat::kDeepSeekV4;
  if (flags.Has("format")) {
    try {
      format = ParseChatFormatName(flags.Get("format"));
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string("--format: ") + e.what());
    }
  } else if (auto from_config = FormatFromModelDir(tokenizer_arg)) {
    format = *from_config;
  }

  ChatRequest request;
  try {
    Json messages = ReadJsonFile(messages_path);
    if (messages.is_array()) {
      request.messages = ParseChatMessages(messages);
    } else {
      request = ParseChatRequest(messages);
    }
  } catch (const ChatFormatError& e) {
    throw std::runtime_error(messages_path + ": " + e.what());
  }
  if (flags.Has("tools")) {
    const std::string tools_path = flags.Get("tools");
    try {
      Json tools = ReadJsonFile(tools_path);
      request.tools = ParseChatTools(tools.is_object() && tools.contains("tools") ? tools["tools"] : tools);
    } catch (const ChatFormatError& e) {
      throw std::runtime_error(tools_path + ": " + e.what());
    }
  }
  if (thinking) request.thinking = *thinking;
  if (add_generation_prompt) request.add_generation_prompt = *add_generation_prompt;

  std::string prompt;
  try {
    prompt = RenderChatPrompt(format, request);
  } catch (const ChatFormatError& e) {
    throw std::runtime_error(messages_path + ": " + e.what());
  }
  const auto tokenizer = Tokenizer::Load(tokenizer_arg);
  std::vector<int32_t> ids = tokenizer->Encode(prompt, /*add_special_tokens=*/false);
  return nlohmann::ordered_json{{"prompt", prompt}, {"ids", ids}};
}

int RunChatPrompt(const std::vector<std::string>& args) {
  std::cout << ChatPromptCommandOutput(args).dump() << "\n";
  return 0;
}

}  // namespace dsmesh

#include "common/chat/deepseek_v4_prompt.h"

#include <algorithm>
#include <map>

#include "common/chat/deepseek_v4_tokens.h"
#include "common/chat/python_json.h"

namespace dsmesh {
namespace {

using Json = nlohmann::ordered_json;
using Role = ChatMessage::Role;

// The fixed texts of the format: the model was trained on them, so they must match to the byte.
constexpr char kToolsSectionHead[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr char kToolsSectionTail[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
    "calls.\n";

constexpr char kReasoningEffortMax[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

// A user turn is a list of blocks once tool results are folded in.
struct Block {
  bool is_tool_result = false;
  std::string text;         // the text, or the tool result content
  std::string tool_use_id;  // tool results only
};

// A message after the encoder's preprocessing: tool messages merged into user turns.
struct Turn {
  Role role;
  const ChatMessage* source = nullptr;  // system/assistant: the original message (null: inserted system)
  std::vector<Block> blocks;            // user turns
  bool has_tools = false;               // system turn carrying the request's tool definitions
};

// Tool results and user text that follow each other form one user turn.
std::vector<Turn> MergeToolMessages(const std::vector<const ChatMessage*>& messages) {
  std::vector<Turn> turns;
  for (const ChatMessage* msg : messages) {
    if (msg->role == Role::kTool || msg->role == Role::kUser) {
      Block block;
      block.is_tool_result = msg->role == Role::kTool;
      block.text = msg->content.value_or("");
      block.tool_use_id = msg->tool_call_id;
      if (turns.empty() || turns.back().role != Role::kUser) turns.push_back(Turn{Role::kUser});
      turns.back().blocks.push_back(std::move(block));
    } else {
      turns.push_back(Turn{msg->role, msg});
    }
  }
  return turns;
}

// Within a user turn, tool results are reordered (stably) to follow the order of the calls in the
// latest assistant message that made calls; results whose id is unknown sort as if first.
void SortToolResultsByCallOrder(std::vector<Turn>& turns) {
  std::map<std::string, size_t> call_order;
  for (Turn& turn : turns) {
    if (turn.role == Role::kAssistant && !turn.source->tool_calls.empty()) {
      call_order.clear();
      for (size_t i = 0; i < turn.source->tool_calls.size(); ++i) {
        const std::string& id = turn.source->tool_calls[i].id;
        if (!id.empty()) call_order[id] = i;
      }
    } else if (turn.role == Role::kUser) {
      std::vector<Block> results;
      for (const Block& b : turn.blocks)
        if (b.is_tool_result) results.push_back(b);
      if (results.size() <= 1 || call_order.empty()) continue;
      auto rank = [&](const Block& b) {
        auto it = call_order.find(b.tool_use_id);
        return it == call_order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (Block& b : turn.blocks)
        if (b.is_tool_result) b = results[next++];
    }
  }
}

std::string RenderUserTurn(const Turn& turn) {
  std::string out = dsv4::kUser;
  for (size_t i = 0; i < turn.blocks.size(); ++i) {
    if (i > 0) out += "\n\n";
    const Block& b = turn.blocks[i];
    out += b.is_tool_result ? "<tool_result>" + b.text + "</tool_result>" : b.text;
  }
  return out;
}

// One DSML parameter line per argument: strings raw with string="true", everything else as Python
// JSON with string="false". Arguments that are not JSON at all become one string parameter named
// "arguments", as the official encoder does.
std::string RenderInvokeArguments(const ChatToolCall& call, const std::string& path) {
  Json args;
  try {
    args = ParseJsonText(call.arguments, path + ".function.arguments");
  } catch (const JsonRangeError& e) {
    throw ChatFormatError(e.what());  // valid JSON we cannot reproduce exactly: refuse, don't guess
  } catch (const JsonSyntaxError&) {
    args = Json::object();
    args["arguments"] = call.arguments;
  }
  if (!args.is_object())
    throw ChatFormatError(path + ".function.arguments must be a JSON object, not a JSON " +
                          std::string(args.type_name()));
  std::string out;
  bool first = true;
  for (const auto& [key, value] : args.items()) {
    if (!first) out += "\n";
    first = false;
    out += std::string("<") + dsv4::kDsml + "parameter name=\"" + key + "\" string=\"" +
           (value.is_string() ? "true" : "false") + "\">";
    out += value.is_string() ? value.get<std::string>() : PythonJsonDumps(value);
    out += dsv4::kParameterClose;
  }
  return out;
}

std::string RenderAssistantTurn(const Turn& turn, size_t index, int last_user_index, bool thinking,
                                bool drop_thinking, const std::string& path) {
  const ChatMessage& msg = *turn.source;
  std::string out;
  if (thinking && (!drop_thinking || static_cast<int>(index) > last_user_index))
    out += msg.reasoning_content.value_or("") + dsv4::kThinkEnd;
  out += msg.content.value_or("");
  if (!msg.tool_calls.empty()) out += "\n\n" + RenderDeepSeekV4ToolCalls(msg.tool_calls, path);
  out += dsv4::kEos;
  return out;
}

}  // namespace

std::string RenderDeepSeekV4ToolsSection(const std::vector<Json>& tools) {
  std::string out = kToolsSectionHead;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i > 0) out += "\n";
    out += PythonJsonDumps(tools[i].at("function"));
  }
  return out + kToolsSectionTail;
}

std::string RenderDeepSeekV4ToolCalls(const std::vector<ChatToolCall>& calls, const std::string& path) {
  std::string out = std::string(dsv4::kToolCallsOpen) + "\n";
  for (size_t i = 0; i < calls.size(); ++i) {
    std::string call_path = path + ".tool_calls[" + std::to_string(i) + "]";
    if (i > 0) out += "\n";
    out += std::string("<") + dsv4::kDsml + "invoke name=\"" + calls[i].name + "\">\n";
    out += RenderInvokeArguments(calls[i], call_path);
    out += std::string("\n") + dsv4::kInvokeClose;
  }
  return out + "\n" + dsv4::kToolCallsClose;
}

std::string RenderDeepSeekV4Prompt(const ChatRequest& request) {
  if (!request.add_generation_prompt)
    throw ChatFormatError(
        "add_generation_prompt=false is not supported by the DeepSeek-V4 format: its encoder always "
        "opens the assistant turn after a user turn");
  if (request.messages.empty()) throw ChatFormatError("messages must not be empty");

  // Remember each message's position in the request for error messages.
  std::map<const ChatMessage*, size_t> request_index;
  std::vector<const ChatMessage*> messages;
  for (size_t i = 0; i < request.messages.size(); ++i) {
    messages.push_back(&request.messages[i]);
    request_index[&request.messages[i]] = i;
  }
  const bool has_tools = !request.tools.empty();
  ChatMessage inserted_system{Role::kSystem};
  if (has_tools && messages.front()->role != Role::kSystem) messages.insert(messages.begin(), &inserted_system);

  std::vector<Turn> turns = MergeToolMessages(messages);
  if (has_tools) turns.front().has_tools = true;
  SortToolResultsByCallOrder(turns);

  int last_user_index = -1;
  for (size_t i = 0; i < turns.size(); ++i)
    if (turns[i].role == Role::kUser) last_user_index = static_cast<int>(i);
  // Tool-using conversations keep every turn's reasoning: the model needs it across tool rounds.
  const bool drop_thinking = !has_tools;
  const bool thinking = request.thinking;

  std::string prompt = dsv4::kBos;
  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& turn = turns[i];
    if (i == 0 && thinking && request.reasoning_effort == ReasoningEffort::kMax) prompt += kReasoningEffortMax;
    switch (turn.role) {
      case Role::kSystem:
        prompt += turn.source->content.value_or("");
        if (turn.has_tools) prompt += "\n\n" + RenderDeepSeekV4ToolsSection(request.tools);
        break;
      case Role::kUser:
        prompt += RenderUserTurn(turn);
        break;
      case Role::kAssistant: {
        std::string path = "messages[" + std::to_string(request_index[turn.source]) + "]";
        prompt += RenderAssistantTurn(turn, i, last_user_index, thinking, drop_thinking, path);
        break;
      }
      case Role::kTool:
        break;  // merged into user turns above
    }
    // A user turn not answered by an assistant message in the request opens the assistant turn.
    bool next_is_assistant = i + 1 < turns.size() && turns[i + 1].role == Role::kAssistant;
    bool is_last = i + 1 == turns.size();
    if (turn.role == Role::kUser && (is_last || next_is_assistant)) {
      prompt += dsv4::kAssistant;
      bool open_thinking = thinking && (!drop_thinking || static_cast<int>(i) >= last_user_index);
      prompt += open_thinking ? dsv4::kThinkStart : dsv4::kThinkEnd;
    }
  }
  return prompt;
}

}  // namespace dsmesh

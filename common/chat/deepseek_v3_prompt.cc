#include "common/chat/deepseek_v3_prompt.h"

namespace dsmesh {
namespace {

constexpr char kBos[] = "<｜begin▁of▁sentence｜>";
constexpr char kEos[] = "<｜end▁of▁sentence｜>";
constexpr char kUser[] = "<｜User｜>";
constexpr char kAssistant[] = "<｜Assistant｜>";
constexpr char kCallsBegin[] = "<｜tool▁calls▁begin｜>";
constexpr char kCallsEnd[] = "<｜tool▁calls▁end｜>";
constexpr char kCallBegin[] = "<｜tool▁call▁begin｜>";
constexpr char kCallEnd[] = "<｜tool▁call▁end｜>";
constexpr char kSep[] = "<｜tool▁sep｜>";
constexpr char kOutputsBegin[] = "<｜tool▁outputs▁begin｜>";
constexpr char kOutputsEnd[] = "<｜tool▁outputs▁end｜>";
constexpr char kOutputBegin[] = "<｜tool▁output▁begin｜>";
constexpr char kOutputEnd[] = "<｜tool▁output▁end｜>";

using Role = ChatMessage::Role;

std::string CallBody(const ChatToolCall& call) {
  return call.type + kSep + call.name + "\n```json\n" + call.arguments + "\n```" + kCallEnd;
}

}  // namespace

std::string RenderDeepSeekV3Prompt(const ChatRequest& request) {
  // The template's `namespace` state, kept across the whole conversation.
  bool any_call_rendered = false;   // ns.is_first
  bool in_tool_outputs = false;     // ns.is_tool
  bool first_tool_output = true;    // ns.is_output_first

  std::string system_prompt;
  bool first_system = true;
  for (const ChatMessage& m : request.messages) {
    if (m.role != Role::kSystem) continue;
    if (!first_system) system_prompt += "\n\n";
    system_prompt += m.content.value_or("");
    first_system = false;
  }

  std::string out = std::string(kBos) + system_prompt;
  for (const ChatMessage& m : request.messages) {
    switch (m.role) {
      case Role::kSystem:
        break;
      case Role::kUser:
        in_tool_outputs = false;
        out += kUser + m.content.value_or("");
        break;
      case Role::kAssistant:
        if (!m.content) {
          in_tool_outputs = false;
          for (const ChatToolCall& call : m.tool_calls) {
            if (!any_call_rendered) {
              out += std::string(kAssistant) + kCallsBegin + kCallBegin + CallBody(call);
              any_call_rendered = true;
            } else {
              out += std::string("\n") + kCallBegin + CallBody(call) + kCallsEnd + kEos;
            }
          }
        } else if (in_tool_outputs) {
          out += kOutputsEnd + *m.content + kEos;
          in_tool_outputs = false;
        } else {
          out += kAssistant + *m.content + kEos;
        }
        break;
      case Role::kTool:
        in_tool_outputs = true;
        if (first_tool_output) {
          out += std::string(kOutputsBegin) + kOutputBegin + m.content.value_or("") + kOutputEnd;
          first_tool_output = false;
        } else {
          out += std::string("\n") + kOutputBegin + m.content.value_or("") + kOutputEnd;
        }
        break;
    }
  }
  if (in_tool_outputs) out += kOutputsEnd;
  if (request.add_generation_prompt && !in_tool_outputs) out += kAssistant;
  return out;
}

}  // namespace dsmesh

// /v1/responses framing (the subset that maps onto chat): the model's output as Responses output items
// -- a `reasoning` item (reasoning_text content) while the model thinks, a `message` item (output_text),
// one `function_call` item per tool call -- inside a `response` object. Streaming emits the event
// sequence the official openai client accumulates: response.created, response.in_progress, then per item
// output_item.added, content_part.added, *.delta ..., *.done, content_part.done, output_item.done, and
// finally response.completed (or response.incomplete when max_output_tokens ran out). One item builder
// serves both modes: non-streaming feeds it the whole output with no one listening.
#include <ctime>
#include <nlohmann/json.hpp>

#include "gateway/generation_session.h"
#include "gateway/generation_writer.h"

namespace dsmesh {

namespace {

using json = nlohmann::json;

class ResponsesWriter : public GenerationWriter {
 public:
  ResponsesWriter(const GenerationJob& job, int64_t created) : job_(job), created_(created) {}

  void Start(const Send& send) override {
    Emit(&send, "response.created", {{"response", Response("in_progress", nullptr, nullptr)}});
    Emit(&send, "response.in_progress", {{"response", Response("in_progress", nullptr, nullptr)}});
  }

  void Delta(const Send& send, int index, const OutputDelta& delta, const json&, const UsageCounts&) override {
    if (index == 0) Feed(&send, delta);
  }

  void ChoiceEnd(const Send&, const ChoiceOutput&, const UsageCounts&) override {}

  void End(const Send& send, const std::vector<ChoiceOutput>& choices, const UsageCounts& usage) override {
    const bool complete = choices.front().finish_reason != "length";
    Close(&send, complete);
    Emit(&send, complete ? "response.completed" : "response.incomplete",
         {{"response", Response(complete ? "completed" : "incomplete", &choices.front(), &usage)}});
  }

  void Error(const Send& send, const ApiError& error) override {
    Emit(&send, "error",
         {{"code", error.code ? json(*error.code) : json(error.type)},
          {"message", error.what()},
          {"param", error.param ? json(*error.param) : json(nullptr)}});
  }

  std::string Body(const std::vector<ChoiceOutput>& choices, const UsageCounts& usage) override {
    const ChoiceOutput& c = choices.front();
    Feed(nullptr, c.total);
    const bool complete = c.finish_reason != "length";
    Close(nullptr, complete);
    return DumpJson(Response(complete ? "completed" : "incomplete", &c, &usage));
  }

 private:
  enum class Kind { kNone, kReasoning, kMessage, kCall };

  json Response(const std::string& status, const ChoiceOutput* choice, const UsageCounts* usage) const {
    json r = {{"id", job_.response_id},
              {"object", "response"},
              {"created_at", created_},
              {"status", status},
              {"background", false},
              {"error", nullptr},
              {"incomplete_details", nullptr},
              {"model", job_.model_name},
              {"output", choice ? items_ : json::array()},
              {"previous_response_id", nullptr},
              {"service_tier", "default"},
              {"store", false},
              {"truncation", "disabled"},
              {"usage", nullptr}};
    if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    if (status == "completed") r["completed_at"] = static_cast<int64_t>(std::time(nullptr));
    for (const auto& [key, value] : job_.echo.items()) r[key] = value;
    if (usage)
      r["usage"] = {{"input_tokens", usage->prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", usage->cached_tokens}}},
                    {"output_tokens", usage->completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", usage->reasoning_tokens}}},
                    {"total_tokens", usage->prompt_tokens + usage->completion_tokens}};
    return r;
  }

  void Emit(const Send* send, const std::string& type, json event) {
    event["type"] = type;
    event["sequence_number"] = sequence_++;
    if (send) (*send)("event: " + type + "\ndata: " + DumpJson(event) + "\n\n");
  }

  int output_index() const { return static_cast<int>(items_.size()) - 1; }
  json& item() { return items_.back(); }

  json Locator() const {
    return {{"item_id", items_.back()["id"]}, {"output_index", output_index()}};
  }

  void Open(const Send* send, Kind kind, const ToolCallDelta* call) {
    Close(send, true);
    open_ = kind;
    const std::string n = std::to_string(items_.size());
    if (kind == Kind::kReasoning) {
      items_.push_back({{"id", "rs_" + job_.request_id + "_" + n}, {"type", "reasoning"}, {"summary", json::array()},
                        {"content", json::array()}, {"status", "in_progress"}});
    } else if (kind == Kind::kMessage) {
      items_.push_back({{"id", "msg_" + job_.request_id + "_" + n}, {"type", "message"}, {"role", "assistant"},
                        {"status", "in_progress"}, {"content", json::array()}});
    } else {
      open_call_ = call->index;
      items_.push_back({{"id", "fc_" + job_.request_id + "_" + n}, {"type", "function_call"}, {"call_id", call->id},
                        {"name", call->name}, {"arguments", ""}, {"status", "in_progress"}});
    }
    Emit(send, "response.output_item.added", {{"output_index", output_index()}, {"item", item()}});
    if (kind == Kind::kCall) return;
    json part = kind == Kind::kReasoning ? json{{"type", "reasoning_text"}, {"text", ""}}
                                         : json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()},
                                                {"logprobs", json::array()}};
    json e = Locator();
    e["content_index"] = 0;
    e["part"] = part;
    Emit(send, "response.content_part.added", e);
    item()["content"].push_back(part);
  }

  void Close(const Send* send, bool complete) {
    if (open_ == Kind::kNone) return;
    const Kind kind = open_;
    open_ = Kind::kNone;
    item()["status"] = complete ? "completed" : "incomplete";
    if (kind == Kind::kCall) {
      json e = Locator();
      e["name"] = item()["name"];
      e["arguments"] = item()["arguments"];
      Emit(send, "response.function_call_arguments.done", e);
    } else {
      const json& part = item()["content"][0];
      json e = Locator();
      e["content_index"] = 0;
      e["text"] = part["text"];
      if (kind == Kind::kMessage) e["logprobs"] = json::array();
      Emit(send, kind == Kind::kMessage ? "response.output_text.done" : "response.reasoning_text.done", e);
      e = Locator();
      e["content_index"] = 0;
      e["part"] = part;
      Emit(send, "response.content_part.done", e);
    }
    Emit(send, "response.output_item.done", {{"output_index", output_index()}, {"item", item()}});
  }

  void Text(const Send* send, Kind kind, const std::string& text) {
    if (text.empty()) return;
    if (open_ != kind) Open(send, kind, nullptr);
    item()["content"][0]["text"] = item()["content"][0]["text"].get<std::string>() + text;
    json e = Locator();
    e["content_index"] = 0;
    e["delta"] = text;
    if (kind == Kind::kMessage) e["logprobs"] = json::array();
    Emit(send, kind == Kind::kMessage ? "response.output_text.delta" : "response.reasoning_text.delta", e);
  }

  void Feed(const Send* send, const OutputDelta& d) {
    Text(send, Kind::kReasoning, d.reasoning);
    Text(send, Kind::kMessage, d.content);
    for (const auto& tc : d.tool_calls) {
      if (open_ != Kind::kCall || open_call_ != tc.index) Open(send, Kind::kCall, &tc);
      if (tc.arguments.empty()) continue;
      item()["arguments"] = item()["arguments"].get<std::string>() + tc.arguments;
      json e = Locator();
      e["delta"] = tc.arguments;
      Emit(send, "response.function_call_arguments.delta", e);
    }
  }

  const GenerationJob& job_;
  const int64_t created_;
  json items_ = json::array();
  Kind open_ = Kind::kNone;
  int open_call_ = -1;
  int sequence_ = 0;
};

}  // namespace

std::unique_ptr<GenerationWriter> MakeResponsesWriter(const GenerationJob& job, int64_t created) {
  return std::make_unique<ResponsesWriter>(job, created);
}

}  // namespace dsmesh

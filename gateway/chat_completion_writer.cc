// /v1/chat/completions and /v1/completions framing: SSE chunks as OpenAI sends them (a role chunk per
// choice, content / reasoning_content / tool_calls deltas, a finish chunk per choice, the usage chunk,
// [DONE]) or one JSON body; every choice carries its `index`.
#include <nlohmann/json.hpp>

#include "gateway/generation_session.h"
#include "gateway/generation_writer.h"

namespace dsmesh {

namespace {

using json = nlohmann::json;

json UsageJson(const UsageCounts& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (u.cached_tokens > 0) j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return j;
}

class ChatCompletionWriter : public GenerationWriter {
 public:
  ChatCompletionWriter(const GenerationJob& job, int64_t created) : job_(job), created_(created) {}

  void Start(const Send& send) override {
    if (!job_.chat) return;
    for (int i = 0; i < job_.options.n; ++i)
      send(Event(Chunk(i, json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr, nullptr, UsageCounts{})));
  }

  void Delta(const Send& send, int index, const OutputDelta& d, const json& logprobs_content,
             const UsageCounts& running) override {
    json logprobs = job_.options.logprobs ? LogprobsJson(logprobs_content) : json(nullptr);
    if (!job_.chat) {
      send(Event(Chunk(index, d.content, logprobs, nullptr, nullptr, running)));
      return;
    }
    json delta = json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& tc : d.tool_calls) {
        json c = {{"index", tc.index}};
        json fn = {{"arguments", tc.arguments}};
        if (!tc.id.empty()) {
          c["id"] = tc.id;
          c["type"] = "function";
        }
        if (!tc.name.empty()) fn["name"] = tc.name;
        c["function"] = fn;
        calls.push_back(c);
      }
      delta["tool_calls"] = calls;
    }
    send(Event(Chunk(index, delta, logprobs, nullptr, nullptr, running)));
  }

  void ChoiceEnd(const Send& send, const ChoiceOutput& c, const UsageCounts& running) override {
    json payload = job_.chat ? json(json::object()) : json("");
    send(Event(Chunk(c.index, payload, nullptr, c.finish_reason, c.stop_reason, running)));
  }

  void End(const Send& send, const std::vector<ChoiceOutput>&, const UsageCounts& usage) override {
    if (job_.options.include_usage) {
      json chunk = Envelope();
      chunk["choices"] = json::array();
      chunk["usage"] = UsageJson(usage);
      send(Event(chunk));
    }
    send("data: [DONE]\n\n");
  }

  void Error(const Send& send, const ApiError& error) override {
    send("data: " + ErrorBody(error) + "\n\n");
    send("data: [DONE]\n\n");
  }

  std::string Body(const std::vector<ChoiceOutput>& choices, const UsageCounts& usage) override {
    json list = json::array();
    for (const auto& c : choices) {
      json logprobs = job_.options.logprobs ? LogprobsJson(c.logprobs) : json(nullptr);
      json choice;
      if (job_.chat) {
        const OutputDelta& t = c.total;
        // No answer text beside reasoning or tool calls is null, as vLLM returns it (a reasoning the
        // budget cut short, a call-only answer); an output with nothing at all stays "".
        const bool no_content = t.content.empty() && (!t.tool_calls.empty() || !t.reasoning.empty());
        json message = {{"role", "assistant"}, {"content", no_content ? json(nullptr) : json(t.content)}};
        if (!t.reasoning.empty()) message["reasoning_content"] = t.reasoning;
        if (!t.tool_calls.empty()) {
          json calls = json::array();
          for (const auto& tc : t.tool_calls)
            calls.push_back(
                {{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
          message["tool_calls"] = calls;
        }
        choice = {{"index", c.index}, {"message", message}, {"logprobs", logprobs}, {"finish_reason", c.finish_reason},
                  {"stop_reason", c.stop_reason}};
      } else {
        choice = {{"index", c.index}, {"text", c.total.content}, {"logprobs", logprobs},
                  {"finish_reason", c.finish_reason}, {"stop_reason", c.stop_reason}};
        if (!c.prompt_logprobs.is_null()) choice["prompt_logprobs"] = c.prompt_logprobs;
      }
      list.push_back(choice);
    }
    json body = Envelope();
    body["object"] = job_.chat ? "chat.completion" : "text_completion";
    body["choices"] = list;
    body["usage"] = UsageJson(usage);
    return DumpJson(body);
  }

 private:
  json Envelope() const {
    return {{"id", job_.response_id},
            {"object", job_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", job_.model_name}};
  }

  // `payload`: the chat delta object, or the completions text.
  json Chunk(int index, const json& payload, const json& logprobs, const json& finish_reason, const json& stop_reason,
             const UsageCounts& running) const {
    json choice = {{"index", index}};
    choice[job_.chat ? "delta" : "text"] = payload;
    choice["logprobs"] = logprobs;
    choice["finish_reason"] = finish_reason;
    if (!finish_reason.is_null()) choice["stop_reason"] = stop_reason;
    json chunk = Envelope();
    chunk["choices"] = json::array({choice});
    if (job_.options.include_usage)
      chunk["usage"] = job_.options.continuous_usage_stats ? UsageJson(running) : json(nullptr);
    return chunk;
  }

  static std::string Event(const json& chunk) { return "data: " + DumpJson(chunk) + "\n\n"; }

  json LogprobsJson(const json& content) const {
    if (job_.chat) return json{{"content", content}};
    // Completions shape: tokens, token_logprobs, top_logprobs [{token: logprob}], text_offset.
    json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
    for (const auto& e : content) {
      tokens.push_back(e["token"]);
      token_logprobs.push_back(e["logprob"]);
      json t = json::object();
      for (const auto& x : e["top_logprobs"]) t[x["token"].get<std::string>()] = x["logprob"];
      top.push_back(t);
      offsets.push_back(0);
    }
    return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
  }

  const GenerationJob& job_;
  const int64_t created_;
};

}  // namespace

std::string DumpJson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::unique_ptr<GenerationWriter> MakeChatCompletionWriter(const GenerationJob& job, int64_t created) {
  return std::make_unique<ChatCompletionWriter>(job, created);
}

}  // namespace dsmesh

// How a generation's choices go on the wire: one writer per API shape. The chat-completions and
// completions writer (chat_completion_writer.cc) frames OpenAI chunks with `index` per choice; the
// Responses writer (responses_writer.cc) frames output items and the response.* event sequence; the
// Anthropic writer (anthropic_writer.cc) frames content blocks and the Messages API's events. The
// session (generation_session.cc) owns the exchange and calls these in order, never concurrently:
//   streaming:      Start, Delta*, ChoiceEnd (per choice), End            (or Error at any point)
//   non-streaming:  Body
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gateway/api_error.h"
#include "gateway/choice_decoder.h"

namespace dsmesh {

struct GenerationJob;

struct UsageCounts {
  int prompt_tokens = 0;
  int completion_tokens = 0;  // all choices (best_of: every sequence generated)
  int cached_tokens = 0;
  int reasoning_tokens = 0;
};

class GenerationWriter {
 public:
  using Send = std::function<void(const std::string&)>;  // bytes of the event stream
  virtual ~GenerationWriter() = default;
  virtual void Start(const Send& send) = 0;
  virtual void Delta(const Send& send, int index, const OutputDelta& delta, const nlohmann::json& logprobs,
                     const UsageCounts& running) = 0;
  virtual void ChoiceEnd(const Send& send, const ChoiceOutput& choice, const UsageCounts& running) = 0;
  virtual void End(const Send& send, const std::vector<ChoiceOutput>& choices, const UsageCounts& usage) = 0;
  virtual void Error(const Send& send, const ApiError& error) = 0;
  virtual std::string Body(const std::vector<ChoiceOutput>& choices, const UsageCounts& usage) = 0;
  // The body of an error answered before the stream started (or instead of a non-streamed body).
  virtual std::string ErrorResponseBody(const ApiError& error) { return ErrorBody(error); }
};

std::unique_ptr<GenerationWriter> MakeChatCompletionWriter(const GenerationJob& job, int64_t created);
std::unique_ptr<GenerationWriter> MakeResponsesWriter(const GenerationJob& job, int64_t created);
std::unique_ptr<GenerationWriter> MakeAnthropicWriter(const GenerationJob& job);

std::string DumpJson(const nlohmann::json& j);  // UTF-8 errors replaced, as every body the gateway sends

}  // namespace dsmesh

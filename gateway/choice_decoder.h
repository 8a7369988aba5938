// One choice of a generation request: the engine's token messages for one sequence -> text deltas
// (incremental detokenizer with stop strings, split into reasoning / content / tool calls), the logprob
// entries, the engine's token counts and the finish reason. No I/O: the session (generation_session.h)
// feeds it messages and the writers (generation_writer.h) frame what it returns.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gateway/output_splitter.h"
#include "gateway/request_options.h"
#include "proto/mesh.pb.h"

namespace dsmesh {

// What one engine message did to a choice.
struct ChoiceStep {
  OutputDelta delta;
  nlohmann::json logprobs = nlohmann::json::array();  // chat-shaped entries {token, logprob, bytes, top_logprobs}
  bool finished = false;      // the choice is complete (finish_reason set)
  bool stop_call = false;     // a stop string ended it: cancel the engine call
  bool aborted = false;       // the mesh aborted it (error set)
  int error_status = 0;       // for aborted: 500 or 503
  std::string error;
};

// A finished choice, as the writers need it.
struct ChoiceOutput {
  int index = 0;
  OutputDelta total;
  nlohmann::json logprobs = nlohmann::json::array();
  std::string finish_reason;  // stop | length | tool_calls
  nlohmann::json stop_reason;  // the stop token id or stop string, else null
  int completion_tokens = 0;
  int reasoning_tokens = 0;    // tokens consumed before the first content or tool call (thinking prompts)
  double cumulative_logprob = 0;
  nlohmann::json prompt_logprobs;  // completions with prompt_logprobs (gateway/prompt_logprobs.h), else null
  int malformed_tool_call_blocks = 0;  // DSML blocks returned as content (or removed: options.tool_calls off)
  int suppressed_tool_calls = 0;       // well-formed calls removed because options.tool_calls is off
};

class ChoiceDecoder {
 public:
  // `chat`: the DeepSeek-V4 chat splitter (reasoning / DSML tool calls; options.tool_calls off: DSML removed);
  // `thinking`: output starts as reasoning.
  ChoiceDecoder(int index, std::shared_ptr<const Tokenizer> tokenizer, const RequestOptions& options, bool chat,
                bool thinking, const std::string& request_id);

  ChoiceStep Consume(const GenerateResponse& m);
  // The result once finished (Consume returned finished).
  const ChoiceOutput& output() const { return out_; }
  bool finished() const { return finished_; }
  int completion_tokens() const;  // engine count, or the tokens up to a stop string
  int prompt_tokens() const { return prompt_tokens_; }
  int cached_tokens() const { return cached_tokens_; }

 private:
  void Append(const OutputDelta& in, OutputDelta* out) const;
  void AddLogprobs(const TokenLogprobs& lp, nlohmann::json* content) const;
  void Finish(ChoiceStep* step, std::string reason);

  std::shared_ptr<const Tokenizer> tokenizer_;
  const RequestOptions& options_;
  bool chat_;
  IncrementalDetokenizer detok_;
  std::unique_ptr<OutputSplitter> splitter_;
  std::set<int> stop_ids_;
  bool finished_ = false;
  bool stopped_by_string_ = false;
  bool answer_started_ = false;  // content or a tool call seen (reasoning_tokens stops counting)
  std::optional<int> stop_token_;
  int prompt_tokens_ = 0, cached_tokens_ = 0, engine_completion_tokens_ = 0, consumed_tokens_ = 0;
  ChoiceOutput out_;
};

// Appends a delta to another (tool-call fragments of the same call merge).
void AppendDelta(const OutputDelta& in, OutputDelta* out);

}  // namespace dsmesh

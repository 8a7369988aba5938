#include "gateway/choice_decoder.h"

#include <algorithm>

namespace dsmesh {

using json = nlohmann::json;

void AppendDelta(const OutputDelta& in, OutputDelta* out) {
  out->reasoning += in.reasoning;
  out->content += in.content;
  for (const auto& tc : in.tool_calls) {
    if (!out->tool_calls.empty() && out->tool_calls.back().index == tc.index) {
      out->tool_calls.back().arguments += tc.arguments;
      if (!tc.name.empty()) out->tool_calls.back().name = tc.name;
      if (!tc.id.empty()) out->tool_calls.back().id = tc.id;
    } else {
      out->tool_calls.push_back(tc);
    }
  }
}

ChoiceDecoder::ChoiceDecoder(int index, std::shared_ptr<const Tokenizer> tokenizer, const RequestOptions& options,
                             bool chat, bool thinking, const std::string& request_id)
    : tokenizer_(tokenizer),
      options_(options),
      chat_(chat),
      // The chat parser needs special-token text ("</think>", DSML markers, EOS) to split the output.
      detok_(tokenizer, options.stop_strings, chat ? false : options.skip_special_tokens),
      splitter_(chat ? MakeChatOutputSplitter(thinking, request_id, options.tool_calls) : MakePlainOutputSplitter()) {
  out_.index = index;
  stop_ids_.insert(options.sampling.stop_token_ids().begin(), options.sampling.stop_token_ids().end());
}

void ChoiceDecoder::Append(const OutputDelta& in, OutputDelta* out) const { AppendDelta(in, out); }

void ChoiceDecoder::AddLogprobs(const TokenLogprobs& lp, json* content) const {
  auto entry = [&](int id, float logprob) {
    std::string text = tokenizer_->Decode({id});
    json bytes = json::array();
    for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
    return json{{"token", text}, {"logprob", logprob}, {"bytes", bytes}};
  };
  json e = entry(lp.token_id(), lp.logprob());
  json top = json::array();
  for (const auto& t : lp.top()) top.push_back(entry(t.token_id(), t.logprob()));
  e["top_logprobs"] = top;
  content->push_back(e);
}

int ChoiceDecoder::completion_tokens() const {
  // Engine counts. When a stop string ended the request early the engine may have produced tokens
  // past it (a speculative step); only those up to the stop count, as in vLLM.
  return stopped_by_string_ ? consumed_tokens_ : std::max(engine_completion_tokens_, consumed_tokens_);
}

static std::string FinishName(FinishReason r) {
  switch (r) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    default: return "abort";
  }
}

void ChoiceDecoder::Finish(ChoiceStep* step, std::string reason) {
  finished_ = true;
  step->finished = true;
  if (chat_ && splitter_->tool_calls_seen() > 0 && reason == "stop") reason = "tool_calls";
  out_.finish_reason = reason;
  if (stop_token_) out_.stop_reason = *stop_token_;
  else if (stopped_by_string_ && !detok_.matched_stop().empty()) out_.stop_reason = detok_.matched_stop();
  else out_.stop_reason = nullptr;
  out_.completion_tokens = completion_tokens();
  out_.malformed_tool_call_blocks = splitter_->malformed_tool_call_blocks();
  out_.suppressed_tool_calls = splitter_->suppressed_tool_calls();
}

ChoiceStep ChoiceDecoder::Consume(const GenerateResponse& m) {
  ChoiceStep step;
  if (finished_) return step;
  if (m.prompt_tokens() > 0) prompt_tokens_ = m.prompt_tokens();
  cached_tokens_ = std::max(cached_tokens_, m.cached_prompt_tokens());
  engine_completion_tokens_ = std::max(engine_completion_tokens_, m.completion_tokens());

  for (int i = 0; i < m.token_ids_size(); ++i) {
    const int id = m.token_ids(i);
    ++consumed_tokens_;
    // A stop token id that ends the request is not part of the text (OpenAI/vLLM behaviour).
    if (m.finish_reason() == FINISH_STOP && i + 1 == m.token_ids_size() && stop_ids_.count(id)) {
      stop_token_ = id;
      break;
    }
    if (i < m.logprobs_size()) {
      out_.cumulative_logprob += m.logprobs(i).logprob();
      if (options_.logprobs) AddLogprobs(m.logprobs(i), &step.logprobs);
    }
    OutputDelta d = splitter_->Push(detok_.Push(id));
    if (!answer_started_ && (!d.content.empty() || !d.tool_calls.empty())) answer_started_ = true;
    if (!answer_started_ && !d.reasoning.empty()) out_.reasoning_tokens = consumed_tokens_;
    Append(d, &step.delta);
    if (detok_.stopped()) {
      stopped_by_string_ = true;
      break;
    }
  }
  if (stopped_by_string_) {
    Append(splitter_->Finish(), &step.delta);
    step.stop_call = true;  // we are done even if the engine is not
    Finish(&step, "stop");
  } else if (m.finish_reason() == FINISH_ABORT) {
    finished_ = true;
    step.aborted = true;
    // The coordinator aborts running requests when the mesh is lost or shuts down: the service is
    // unavailable (503, retry), not broken; only its own "internal error: ..." aborts are a 500.
    step.error_status = m.error().rfind("internal error", 0) == 0 ? 500 : 503;
    step.error = m.error().empty() ? "the request was aborted in the mesh" : m.error();
  } else if (m.finish_reason() != FINISH_NONE) {
    Append(splitter_->Push(detok_.Flush()), &step.delta);
    Append(splitter_->Finish(), &step.delta);
    Finish(&step, FinishName(m.finish_reason()));
  }
  Append(step.delta, &out_.total);
  for (const auto& lp : step.logprobs) out_.logprobs.push_back(lp);
  return step;
}

}  // namespace dsmesh

#include "gateway/generation_session.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "gateway/api_error.h"
#include "gateway/output_splitter.h"
#include "gateway/prompt_logprobs.h"

namespace dsmesh {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

using json = nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string FinishName(FinishReason r) {
  switch (r) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    default: return "abort";
  }
}

int HttpStatusFor(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE: return 400;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 503;
    default: return 500;
  }
}

class GenerationSession : public std::enable_shared_from_this<GenerationSession> {
 public:
  GenerationSession(std::shared_ptr<HttpExchange> exchange, const GenerationServices& services, GenerationJob job,
                    std::unique_ptr<Admission::Ticket> ticket)
      : exchange_(std::move(exchange)),
        services_(services),
        job_(std::move(job)),
        ticket_(std::move(ticket)),
        // The chat parser needs special-token text ("</think>", DSML markers, EOS) to split the output.
        detok_(services.tokenizer, job_.options.stop_strings, job_.chat ? false : job_.options.skip_special_tokens),
        splitter_(job_.chat ? MakeChatOutputSplitter(job_.thinking, job_.request_id) : MakePlainOutputSplitter()),
        created_(static_cast<int64_t>(std::time(nullptr))) {
    stop_ids_.insert(job_.options.sampling.stop_token_ids().begin(), job_.options.sampling.stop_token_ids().end());
    if (job_.options.prompt_logprobs) {
      auto tokenizer = services.tokenizer;
      prompt_logprobs_ = std::make_unique<PromptLogprobs>(job_.prompt_ids, *job_.options.prompt_logprobs,
                                                          [tokenizer](int id) { return tokenizer->Decode({id}); });
    }
  }

  void Start() {
    GenerateRequest request;
    request.set_request_id(job_.request_id);
    for (int id : job_.prompt_ids) request.add_prompt_token_ids(id);
    *request.mutable_sampling() = job_.options.sampling;
    request.mutable_sampling()->set_max_tokens(job_.max_tokens);
    request.set_priority(job_.options.priority);
    // prompt_logprobs: every prompt position's logits come back (and the prefix cache is bypassed).
    request.set_return_logits(prompt_logprobs_ != nullptr);

    if (job_.options.stream) {
      exchange_->StartStream(200, "text/event-stream", job_.response_headers, ": ping\n\n");
      if (job_.chat) {
        json delta = {{"role", "assistant"}, {"content", ""}};
        SendChunk(ChatChunk(delta, nullptr, nullptr));
      }
    }
    auto self = shared_from_this();
    std::weak_ptr<GenerationSession> weak = self;
    exchange_->OnDisconnect([weak] {
      if (auto s = weak.lock()) s->CancelForDisconnect();
    });
    auto call = services_.mesh->Generate(
        request, [self](const GenerateResponse& m) { self->OnMessage(m); },
        [self](const grpc::Status& s) { self->OnDone(s); });
    std::lock_guard<std::mutex> lock(call_mu_);
    call_ = call;
    if (cancel_requested_) call_->Cancel();
  }

 private:
  // ---- events (gRPC threads, serialized per call) -------------------------------------------

  void OnMessage(const GenerateResponse& m) {
    if (finished_) return;
    // An exception must not escape into gRPC's callback thread (it would terminate the gateway): a
    // token id outside the vocabulary, say, ends this request with an error instead.
    try {
      HandleMessage(m);
    } catch (const std::exception& e) {
      Fail(500, std::string("cannot process the engine's output: ") + e.what(), "error");
      CancelCall();
    }
  }

  void HandleMessage(const GenerateResponse& m) {
    const double now = SteadySeconds();
    if (m.prompt_tokens() > 0) prompt_tokens_ = m.prompt_tokens();
    cached_tokens_ = std::max(cached_tokens_, m.cached_prompt_tokens());
    if (m.queue_time_s() > 0 && !queue_s_) queue_s_ = m.queue_time_s();
    if (m.token_ids_size() > 0) {
      if (!first_token_s_) first_token_s_ = now;
      else services_.metrics->ObserveInterTokenLatency(now - last_token_s_);
      last_token_s_ = now;
    }
    engine_completion_tokens_ = std::max(engine_completion_tokens_, m.completion_tokens());
    if (prompt_logprobs_)
      for (const LogitsRow& row : m.logits()) prompt_logprobs_->AddRow(row.position(), row.values().data(), row.values_size());

    OutputDelta delta;
    json logprobs_content = json::array();
    for (int i = 0; i < m.token_ids_size(); ++i) {
      const int id = m.token_ids(i);
      ++consumed_tokens_;
      // A stop token id that ends the request is not part of the text (OpenAI/vLLM behaviour).
      bool is_final_stop = m.finish_reason() == FINISH_STOP && i + 1 == m.token_ids_size() && stop_ids_.count(id);
      if (is_final_stop) {
        stop_reason_ = id;
        break;
      }
      std::string text = detok_.Push(id);
      if (i < m.logprobs_size() && job_.options.logprobs) AddLogprobs(m.logprobs(i), &logprobs_content);
      Append(splitter_->Push(text), &delta);
      if (detok_.stopped()) {
        stopped_by_string_ = true;
        break;
      }
    }
    if (stopped_by_string_) {
      Append(splitter_->Finish(), &delta);
      EmitDelta(delta, logprobs_content);
      Finish("stop");
      CancelCall();  // we are done even if the engine is not
      return;
    }
    if (m.finish_reason() != FINISH_NONE) {
      if (m.finish_reason() == FINISH_ABORT) {
        EmitDelta(delta, logprobs_content);
        // The coordinator aborts running requests when the mesh is lost or shuts down: the service is
        // unavailable (503, retry), not broken; only its own "internal error: ..." aborts are a 500.
        const bool internal = m.error().rfind("internal error", 0) == 0;
        return Fail(internal ? 500 : 503, m.error().empty() ? "the request was aborted in the mesh" : m.error(),
                    "abort");
      }
      Append(FlushText(), &delta);
      EmitDelta(delta, logprobs_content);
      return Finish(FinishName(m.finish_reason()));
    }
    EmitDelta(delta, logprobs_content);
  }

  void OnDone(const grpc::Status& status) {
    if (!finished_) {
      if (client_gone_) {
        Record("abort");
        finished_ = true;
      } else if (status.ok()) {
        // The stream ended without a finishing message: the engine broke its contract.
        Fail(500, "the coordinator ended the stream without a finish reason", "error");
      } else {
        Fail(HttpStatusFor(status), "mesh error: " + status.error_message(), "error");
      }
    }
    ticket_.reset();  // the slot is free once the engine side is done
  }

  void CancelForDisconnect() {
    client_gone_ = true;
    spdlog::info("request {}: client disconnected, aborting in the mesh", job_.request_id);
    CancelCall();
  }

  void CancelCall() {
    std::lock_guard<std::mutex> lock(call_mu_);
    cancel_requested_ = true;
    if (call_) call_->Cancel();
  }

  // ---- text --------------------------------------------------------------------------------

  OutputDelta FlushText() {
    OutputDelta d = splitter_->Push(detok_.Flush());
    Append(splitter_->Finish(), &d);
    return d;
  }

  static void Append(const OutputDelta& in, OutputDelta* out) {
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

  void AddLogprobs(const TokenLogprobs& lp, json* content) {
    auto entry = [&](int id, float logprob) {
      std::string text = services_.tokenizer->Decode({id});
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

  // ---- output ------------------------------------------------------------------------------

  void EmitDelta(const OutputDelta& d, const json& logprobs_content) {
    if (d.empty() && logprobs_content.empty()) return;
    // Accumulate for the non-streaming answer (and for the final tool-call list).
    Append(d, &total_);
    for (const auto& lp : logprobs_content) all_logprobs_.push_back(lp);
    if (!job_.options.stream) return;
    json logprobs = nullptr;
    if (job_.options.logprobs) logprobs = LogprobsJson(logprobs_content);
    if (job_.chat) {
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
      SendChunk(ChatChunk(delta, nullptr, logprobs));
    } else {
      SendChunk(CompletionChunk(d.content, nullptr, logprobs));
    }
  }

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

  json Usage() const {
    // Engine counts. When a stop string ended the request early the engine may have produced tokens
    // past it (a speculative step); only those up to the stop count, as in vLLM.
    int completion = stopped_by_string_ ? consumed_tokens_ : std::max(engine_completion_tokens_, consumed_tokens_);
    json u = {{"prompt_tokens", prompt_tokens_},
              {"completion_tokens", completion},
              {"total_tokens", prompt_tokens_ + completion}};
    if (cached_tokens_ > 0) u["prompt_tokens_details"] = {{"cached_tokens", cached_tokens_}};
    return u;
  }

  json ChatChunk(const json& delta, const json& finish_reason, const json& logprobs) const {
    json choice = {{"index", 0}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
    if (!finish_reason.is_null()) choice["stop_reason"] = StopReasonJson();
    json chunk = {{"id", job_.response_id},   {"object", "chat.completion.chunk"}, {"created", created_},
                  {"model", job_.model_name}, {"choices", json::array({choice})}};
    if (job_.options.include_usage) chunk["usage"] = job_.options.continuous_usage_stats ? Usage() : json(nullptr);
    return chunk;
  }

  json CompletionChunk(const std::string& text, const json& finish_reason, const json& logprobs) const {
    json choice = {{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
    if (!finish_reason.is_null()) choice["stop_reason"] = StopReasonJson();
    json chunk = {{"id", job_.response_id},   {"object", "text_completion"}, {"created", created_},
                  {"model", job_.model_name}, {"choices", json::array({choice})}};
    if (job_.options.include_usage) chunk["usage"] = job_.options.continuous_usage_stats ? Usage() : json(nullptr);
    return chunk;
  }

  json StopReasonJson() const {
    if (stop_reason_) return *stop_reason_;
    if (stopped_by_string_ && !detok_.matched_stop().empty()) return detok_.matched_stop();
    return nullptr;
  }

  void SendChunk(const json& chunk) { exchange_->SendChunk("data: " + Dump(chunk) + "\n\n"); }

  void Finish(std::string reason) {
    if (finished_) return;
    finished_ = true;
    if (job_.chat && splitter_->tool_calls_seen() > 0 && reason == "stop") reason = "tool_calls";
    if (job_.options.stream) {
      if (job_.chat) SendChunk(ChatChunk(json::object(), reason, nullptr));
      else SendChunk(CompletionChunk("", reason, nullptr));
      if (job_.options.include_usage) {
        json usage_chunk = {{"id", job_.response_id},
                            {"object", job_.chat ? "chat.completion.chunk" : "text_completion"},
                            {"created", created_},
                            {"model", job_.model_name},
                            {"choices", json::array()},
                            {"usage", Usage()}};
        SendChunk(usage_chunk);
      }
      exchange_->SendChunk("data: [DONE]\n\n");
      exchange_->FinishStream();
    } else {
      json choice;
      json logprobs = job_.options.logprobs ? LogprobsJson(all_logprobs_) : json(nullptr);
      if (job_.chat) {
        json message = {{"role", "assistant"},
                        {"content", total_.content.empty() && !total_.tool_calls.empty() ? json(nullptr)
                                                                                          : json(total_.content)}};
        if (!total_.reasoning.empty()) message["reasoning_content"] = total_.reasoning;
        if (!total_.tool_calls.empty()) {
          json calls = json::array();
          for (const auto& tc : total_.tool_calls)
            calls.push_back({{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
          message["tool_calls"] = calls;
        }
        choice = {{"index", 0}, {"message", message}, {"logprobs", logprobs}, {"finish_reason", reason},
                  {"stop_reason", StopReasonJson()}};
      } else {
        choice = {{"index", 0}, {"text", total_.content}, {"logprobs", logprobs}, {"finish_reason", reason},
                  {"stop_reason", StopReasonJson()}};
        if (prompt_logprobs_) {
          if (auto missing = prompt_logprobs_->FirstMissing()) {
            finished_ = false;
            return Fail(500, "the mesh returned no logits for prompt position " + std::to_string(*missing), "error");
          }
          choice["prompt_logprobs"] = prompt_logprobs_->ToJson();
        }
      }
      json body = {{"id", job_.response_id},
                   {"object", job_.chat ? "chat.completion" : "text_completion"},
                   {"created", created_},
                   {"model", job_.model_name},
                   {"choices", json::array({choice})},
                   {"usage", Usage()}};
      exchange_->Respond(200, "application/json", Dump(body), job_.response_headers);
    }
    Record(reason == "tool_calls" ? "stop" : reason);
  }

  // Ends the request with an error: a status code when nothing was sent yet, else an error event
  // followed by [DONE] (a stream must never just go silent).
  void Fail(int status, const std::string& message, const std::string& reason) {
    if (finished_) return;
    finished_ = true;
    spdlog::warn("request {}: {}", job_.request_id, message);
    ApiError error(status, message, status == 503 ? "unavailable_error" : status == 400 ? "invalid_request_error"
                                                                                           : "server_error");
    if (job_.options.stream) {
      exchange_->SendChunk("data: " + ErrorBody(error) + "\n\n");
      exchange_->SendChunk("data: [DONE]\n\n");
      exchange_->FinishStream();
    } else {
      HeaderList headers = job_.response_headers;
      if (status == 503) headers.emplace_back("Retry-After", kRetryAfterSeconds);
      exchange_->Respond(status, "application/json", ErrorBody(error), headers);
    }
    Record(reason);
  }

  void Record(const std::string& reason) {
    const double now = SteadySeconds();
    FinishedRequestFigures f;
    f.finished_reason = reason;
    f.prompt_tokens = prompt_tokens_ > 0 ? prompt_tokens_ : static_cast<int>(job_.prompt_ids.size());
    f.generation_tokens = stopped_by_string_ ? consumed_tokens_ : std::max(engine_completion_tokens_, consumed_tokens_);
    f.max_tokens_param = job_.options.max_tokens.value_or(0);
    if (first_token_s_) {
      f.ttft_s = *first_token_s_ - job_.arrival_s;
      f.decode_s = last_token_s_ - *first_token_s_;
      if (queue_s_) f.prefill_s = std::max(0.0, *f.ttft_s - *queue_s_);
    }
    f.e2e_s = now - job_.arrival_s;
    f.queue_s = queue_s_;
    services_.metrics->ObserveFinished(f);
    spdlog::info("request {}: {} prompt={} completion={} ttft={:.3f}s e2e={:.3f}s", job_.request_id, reason,
                 f.prompt_tokens, f.generation_tokens, f.ttft_s.value_or(-1), f.e2e_s);
  }

  std::shared_ptr<HttpExchange> exchange_;
  GenerationServices services_;
  GenerationJob job_;
  std::unique_ptr<Admission::Ticket> ticket_;
  IncrementalDetokenizer detok_;
  std::unique_ptr<OutputSplitter> splitter_;
  const int64_t created_;
  std::set<int> stop_ids_;

  std::mutex call_mu_;
  std::shared_ptr<GenerateCall> call_;
  bool cancel_requested_ = false;
  std::atomic<bool> client_gone_{false};

  bool finished_ = false;
  bool stopped_by_string_ = false;
  std::optional<int> stop_reason_;
  int prompt_tokens_ = 0, cached_tokens_ = 0, engine_completion_tokens_ = 0, consumed_tokens_ = 0;
  std::optional<double> first_token_s_, queue_s_;
  double last_token_s_ = 0;
  OutputDelta total_;
  json all_logprobs_ = json::array();
  std::unique_ptr<PromptLogprobs> prompt_logprobs_;  // when the request asked for prompt_logprobs
};

}  // namespace

void StartGeneration(std::shared_ptr<HttpExchange> exchange, const GenerationServices& services, GenerationJob job,
                     std::unique_ptr<Admission::Ticket> ticket) {
  auto session = std::make_shared<GenerationSession>(std::move(exchange), services, std::move(job), std::move(ticket));
  session->Start();
}

}  // namespace dsmesh

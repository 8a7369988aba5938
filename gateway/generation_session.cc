#include "gateway/generation_session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <mutex>
#include <optional>

#include "gateway/api_error.h"
#include "gateway/choice_decoder.h"
#include "gateway/generation_writer.h"
#include "gateway/prompt_logprobs.h"

namespace dsmesh {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t ChoiceSeed(uint64_t seed, int choice) {
  if (choice == 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(choice);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace {

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
        created_(static_cast<int64_t>(std::time(nullptr))) {
    writer_ = job_.api == GenerationApi::kResponses    ? MakeResponsesWriter(job_, created_)
              : job_.api == GenerationApi::kAnthropic ? MakeAnthropicWriter(job_)
                                                      : MakeChatCompletionWriter(job_, created_);
    const int sequences = std::max(1, job_.options.best_of);
    for (int i = 0; i < sequences; ++i) {
      Sequence s;
      s.decoder = std::make_unique<ChoiceDecoder>(i, services_.tokenizer, job_.options, job_.chat, job_.thinking,
                                                  SequenceId(i));
      sequences_.push_back(std::move(s));
    }
    send_ = [this](const std::string& bytes) { exchange_->SendChunk(bytes); };
    if (job_.options.prompt_logprobs) {
      auto tokenizer = services_.tokenizer;
      prompt_logprobs_ = std::make_unique<PromptLogprobs>(job_.prompt_ids, *job_.options.prompt_logprobs,
                                                          [tokenizer](int id) { return tokenizer->Decode({id}); });
    }
  }

  void Start() {
    // Nothing is answered before the coordinator admits the request (admission is its decision, shared by
    // every gateway): a refusal is still a plain 429/503/400 answer, even for a streaming request. The
    // stream opens when choice 0 is admitted (OnAdmitted).
    std::weak_ptr<GenerationSession> weak = shared_from_this();
    exchange_->OnDisconnect([weak] {
      if (auto s = weak.lock()) s->CancelForDisconnect();
    });
    Submit(0, 1);
  }

 private:
  struct Sequence {
    std::unique_ptr<ChoiceDecoder> decoder;
    std::shared_ptr<GenerateCall> call;
    bool call_done = false;
  };

  std::string SequenceId(int i) const { return i == 0 ? job_.request_id : job_.request_id + "-" + std::to_string(i); }

  // Opens the Generate streams of sequences [first, last).
  void Submit(int first, int last) {
    std::vector<std::pair<int, GenerateRequest>> requests;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      if (finished_ || cancel_requested_) return MaybeRelease();
      for (int i = first; i < last; ++i) {
        GenerateRequest request;
        request.set_request_id(SequenceId(i));
        for (int id : job_.prompt_ids) request.add_prompt_token_ids(id);
        for (const PromptImage& im : job_.images) *request.add_images() = im;
        *request.mutable_sampling() = job_.options.sampling;
        SamplingParams* sp = request.mutable_sampling();
        sp->set_max_tokens(job_.max_tokens);
        if (sp->has_seed()) sp->set_seed(ChoiceSeed(sp->seed(), i));
        if (job_.options.best_of > job_.options.n) sp->set_want_logprobs(true);  // ranked by cumulative logprob
        request.set_priority(job_.options.priority);
        if (job_.max_queued) request.set_max_queued(*job_.max_queued);
        // prompt_logprobs: every prompt position's logits come back (and the prefix cache is bypassed). The
        // prompt rows are the same for every choice, so only choice 0 asks for them.
        request.set_return_logits(prompt_logprobs_ != nullptr && i == 0);
        requests.emplace_back(i, std::move(request));
        ++calls_started_;
      }
    }
    auto self = shared_from_this();
    for (auto& [i, request] : requests) {
      const int index = i;
      auto call = services_.mesh->Generate(
          request, [self, index](const GenerateResponse& m) { self->OnMessage(index, m); },
          [self, index](const grpc::Status& s) { self->OnDone(index, s); },
          [self, index] {
            if (index == 0) self->OnAdmitted();
          });
      std::lock_guard<std::recursive_mutex> lock(mu_);
      sequences_[index].call = call;
      if (cancel_requested_ || finished_) call->Cancel();
    }
  }

  const char* Path() const {
    return job_.api == GenerationApi::kResponses   ? "/v1/responses"
           : job_.api == GenerationApi::kAnthropic ? "/v1/messages"
           : job_.chat                             ? "/v1/chat/completions"
                                                   : "/v1/completions";
  }

  void OnAdmitted() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (finished_ || admitted_) return;
    admitted_ = true;
    services_.metrics->CountHttpRequest(Path(), "POST", 200);
    if (job_.options.stream) {
      exchange_->StartStream(200, "text/event-stream", job_.response_headers, ": ping\n\n");
      writer_->Start(send_);
    }
  }

  // ---- events (gRPC threads; one mutex for all of the request's streams) ----------------------

  void OnMessage(int index, const GenerateResponse& m) {
    bool submit_rest = false;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      if (index == 0 && !rest_submitted_) {
        rest_submitted_ = true;
        submit_rest = sequences_.size() > 1;
      }
      if (!finished_) {
        // An exception must not escape into gRPC's callback thread (it would terminate the gateway): a
        // token id outside the vocabulary, say, ends this request with an error instead.
        try {
          HandleMessage(index, m);
        } catch (const std::exception& e) {
          Fail(500, std::string("cannot process the engine's output: ") + e.what(), "error");
        }
      }
    }
    if (submit_rest) Submit(1, static_cast<int>(sequences_.size()));
  }

  void HandleMessage(int index, const GenerateResponse& m) {
    const double now = SteadySeconds();
    if (index == 0) {
      if (m.queue_time_s() > 0 && !queue_s_) queue_s_ = m.queue_time_s();
      if (m.token_ids_size() > 0) {
        if (!first_token_s_) first_token_s_ = now;
        else services_.metrics->ObserveInterTokenLatency(now - last_token_s_);
        last_token_s_ = now;
      }
    } else if (m.token_ids_size() > 0) {
      last_token_s_ = std::max(last_token_s_, now);
    }
    if (index == 0 && prompt_logprobs_)
      for (const LogitsRow& row : m.logits()) prompt_logprobs_->AddRow(row.position(), row.values().data(), row.values_size());
    Sequence& seq = sequences_[index];
    ChoiceStep step = seq.decoder->Consume(m);
    if (step.aborted) return Fail(step.error_status, step.error, "abort");
    // Sequences beyond n (best_of) are never streamed; streaming with best_of > n is refused up front.
    if (job_.options.stream && (!step.delta.empty() || !step.logprobs.empty()))
      writer_->Delta(send_, index, step.delta, step.logprobs, Usage());
    if (!step.finished) return;
    if (step.stop_call && seq.call) seq.call->Cancel();
    if (job_.options.stream) writer_->ChoiceEnd(send_, seq.decoder->output(), Usage());
    if (++finished_sequences_ == static_cast<int>(sequences_.size())) Complete();
  }

  void OnDone(int index, const grpc::Status& status) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    sequences_[index].call_done = true;
    ++calls_done_;
    if (index == 0 && !rest_submitted_) rest_submitted_ = true;  // nothing more will be submitted for it
    if (!finished_ && !sequences_[index].decoder->finished()) {
      if (client_gone_) {
        finished_ = true;
        Record("abort");
      } else if (status.ok()) {
        // The stream ended without a finishing message: the engine broke its contract.
        Fail(500, "the coordinator ended the stream without a finish reason", "error");
      } else if (!admitted_) {
        Refuse(HttpStatusFor(status), status.error_message());
      } else {
        Fail(HttpStatusFor(status), "mesh error: " + status.error_message(), "error");
      }
    }
    MaybeRelease();
  }

  // The admission slot is free once the engine side is done with every sequence it will ever run.
  void MaybeRelease() {
    const bool no_more = finished_ || cancel_requested_ || (rest_submitted_ && calls_started_ == static_cast<int>(sequences_.size()));
    if (no_more && calls_done_ == calls_started_) ticket_.reset();
  }

  void CancelForDisconnect() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    client_gone_ = true;
    spdlog::info("request {}: client disconnected, aborting in the mesh", job_.request_id);
    CancelAll();
    if (!finished_ && calls_started_ == calls_done_) {
      finished_ = true;
      Record("abort");
    }
    MaybeRelease();
  }

  void CancelAll() {
    cancel_requested_ = true;
    for (auto& s : sequences_)
      if (s.call && !s.call_done) s.call->Cancel();
  }

  // ---- output ------------------------------------------------------------------------------

  UsageCounts Usage() const {
    UsageCounts u;
    for (const auto& s : sequences_) {
      u.prompt_tokens = std::max(u.prompt_tokens, s.decoder->prompt_tokens());
      // Choices 1.. start from choice 0's prefix-cache snapshot: the most any sequence found cached.
      u.cached_tokens = std::max(u.cached_tokens, s.decoder->cached_tokens());
      u.completion_tokens += s.decoder->completion_tokens();
    }
    return u;
  }

  void Complete() {
    if (prompt_logprobs_)
      if (auto missing = prompt_logprobs_->FirstMissing())
        return Fail(500, "the mesh returned no logits for prompt position " + std::to_string(*missing), "error");
    finished_ = true;
    std::vector<ChoiceOutput> outputs;
    for (const auto& s : sequences_) outputs.push_back(s.decoder->output());
    if (prompt_logprobs_) {
      // vLLM repeats the prompt's logprobs in every choice (they do not depend on the sampled tokens).
      const nlohmann::json prompt_logprobs = prompt_logprobs_->ToJson();
      for (auto& o : outputs) o.prompt_logprobs = prompt_logprobs;
    }
    UsageCounts usage = Usage();
    for (const auto& o : outputs) usage.reasoning_tokens += o.reasoning_tokens;
    if (static_cast<int>(outputs.size()) > job_.options.n) {
      // best_of: the n sequences with the highest cumulative logprob, best first (vLLM).
      std::stable_sort(outputs.begin(), outputs.end(), [](const ChoiceOutput& a, const ChoiceOutput& b) {
        return a.cumulative_logprob > b.cumulative_logprob;
      });
      outputs.resize(job_.options.n);
      for (int i = 0; i < job_.options.n; ++i) outputs[i].index = i;
    }
    if (job_.options.stream) {
      writer_->End(send_, outputs, usage);
      exchange_->FinishStream();
    } else {
      exchange_->Respond(200, "application/json", writer_->Body(outputs, usage), job_.response_headers);
    }
    const std::string& reason = outputs.front().finish_reason;
    Record(reason == "tool_calls" ? "stop" : reason);
    CancelAll();  // sequences that stopped on a string may still be running in the engine
  }

  // The coordinator refused the request before admitting it (nothing was sent yet): queue full (429,
  // shared by every gateway), not ready or draining (503), invalid (400). Not a finished request.
  void Refuse(int status, const std::string& message) {
    finished_ = true;
    const std::string path = Path();
    spdlog::warn("request {}: {} {}", job_.request_id, status, message);
    std::optional<std::string> code;
    if (status == 429) {
      services_.metrics->CountRejected("queue_full");
      code = "queue_full";
    } else if (status == 503) {
      services_.metrics->CountRejected("not_ready");
    }
    services_.metrics->CountHttpRequest(path, "POST", status);
    ApiError error(status, message, ErrorType(status), std::nullopt, code);
    HeaderList headers = job_.response_headers;
    if (status == 503) headers.emplace_back("Retry-After", kRetryAfterSeconds);
    exchange_->Respond(status, "application/json", writer_->ErrorResponseBody(error), headers);
  }

  static std::string ErrorType(int status) {
    switch (status) {
      case 400: return "invalid_request_error";
      case 429: return "rate_limit_error";
      case 503: return "unavailable_error";
      default: return "server_error";
    }
  }

  // Ends the request with an error: a status code when nothing was sent yet, else an error event
  // (a stream must never just go silent). Every other sequence is cancelled.
  void Fail(int status, const std::string& message, const std::string& reason) {
    if (finished_) return;
    finished_ = true;
    spdlog::warn("request {}: {}", job_.request_id, message);
    ApiError error(status, message, ErrorType(status));
    if (job_.options.stream && admitted_) {
      writer_->Error(send_, error);
      exchange_->FinishStream();
    } else {
      HeaderList headers = job_.response_headers;
      if (status == 503) headers.emplace_back("Retry-After", kRetryAfterSeconds);
      exchange_->Respond(status, "application/json", writer_->ErrorResponseBody(error), headers);
    }
    Record(reason);
    CancelAll();
  }

  void Record(const std::string& reason) {
    const double now = SteadySeconds();
    FinishedRequestFigures f;
    f.finished_reason = reason;
    const UsageCounts usage = Usage();
    f.prompt_tokens = usage.prompt_tokens > 0 ? usage.prompt_tokens : static_cast<int>(job_.prompt_ids.size());
    f.generation_tokens = usage.completion_tokens;
    f.max_tokens_param = job_.options.max_tokens.value_or(0);
    f.image_inputs = static_cast<int>(job_.images.size());
    for (const PromptImage& im : job_.images) f.image_tokens += im.length();
    for (const Sequence& s : sequences_) {
      if (!s.decoder->finished()) continue;
      f.malformed_tool_call_blocks += s.decoder->output().malformed_tool_call_blocks;
      f.suppressed_tool_calls += s.decoder->output().suppressed_tool_calls;
    }
    if (first_token_s_) {
      f.ttft_s = *first_token_s_ - job_.arrival_s;
      f.decode_s = last_token_s_ - *first_token_s_;
      if (queue_s_) f.prefill_s = std::max(0.0, *f.ttft_s - *queue_s_);
    }
    f.e2e_s = now - job_.arrival_s;
    f.queue_s = queue_s_;
    services_.metrics->ObserveFinished(f);
    spdlog::info("request {}: {} prompt={} completion={} sequences={} ttft={:.3f}s e2e={:.3f}s", job_.request_id,
                 reason, f.prompt_tokens, f.generation_tokens, sequences_.size(), f.ttft_s.value_or(-1), f.e2e_s);
  }

  std::shared_ptr<HttpExchange> exchange_;
  GenerationServices services_;
  GenerationJob job_;
  std::unique_ptr<Admission::Ticket> ticket_;
  const int64_t created_;
  std::unique_ptr<GenerationWriter> writer_;
  GenerationWriter::Send send_;

  std::recursive_mutex mu_;  // recursive: a Cancel() may run a stream's on_done on this thread
  std::vector<Sequence> sequences_;
  int calls_started_ = 0, calls_done_ = 0, finished_sequences_ = 0;
  bool rest_submitted_ = false;
  bool cancel_requested_ = false;
  bool client_gone_ = false;
  bool finished_ = false;
  bool admitted_ = false;  // the coordinator admitted choice 0 (a stream's 200 is sent then)
  std::optional<double> first_token_s_, queue_s_;
  double last_token_s_ = 0;
  std::unique_ptr<PromptLogprobs> prompt_logprobs_;  // when the request asked for prompt_logprobs (choice 0's rows)
};

}  // namespace

void StartGeneration(std::shared_ptr<HttpExchange> exchange, const GenerationServices& services, GenerationJob job,
                     std::unique_ptr<Admission::Ticket> ticket) {
  auto session = std::make_shared<GenerationSession>(std::move(exchange), services, std::move(job), std::move(ticket));
  session->Start();
}

}  // namespace dsmesh

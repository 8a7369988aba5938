// TEST FIXTURE, not an engine: a scripted token source implementing the Generate service
// (proto/mesh.proto) so the gateway's HTTP layer can be tested without a model. It "parrots": the reply
// is the token ids of the last user turn of the prompt (between the last --user-token-id and the next
// --assistant-token-id), or the whole prompt when those are absent (completions). A test therefore
// scripts the model's output by writing it as the user message, e.g. "why</think>answer" or a DSML
// tool call. It behaves like the scheduler where the gateway can observe it: --slots running requests,
// the rest waiting in FIFO order, one engine step every --step-ms emitting --tokens-per-step tokens
// (to mimic speculative decoding: usage must count tokens, not chunks), max_tokens -> length,
// stop_token_ids -> stop, cancellation frees the slot, Stats reports running/waiting and counters.
// With temperature > 0 the reply is rotated by the seed (or a random offset without one), so equal
// seeds give equal outputs.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/flags.h"
#include "proto/mesh.grpc.pb.h"

namespace dsmesh {
namespace {

struct Options {
  int user_token_id = -1;
  int assistant_token_id = -1;
  int bos_token_id = 0;
  int eos_token_id = 1;
  int slots = 4;
  int step_ms = 10;
  int tokens_per_step = 1;
  int max_model_len = 4096;
  bool not_ready = false;
  bool emit_invalid_token = false;  // the second token is an id outside any vocabulary (engine bug)
};

class ParrotService final : public Generate::Service {
 public:
  explicit ParrotService(Options o) : o_(o) {}

  grpc::Status Generate(grpc::ServerContext* context, const GenerateRequest* request,
                        grpc::ServerWriter<GenerateResponse>* writer) override {
    const auto& prompt = request->prompt_token_ids();
    if (prompt.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty prompt");
    std::vector<int> reply = Reply(*request);
    const auto arrival = std::chrono::steady_clock::now();
    // Wait for a slot (FIFO), giving up if the client cancels.
    uint64_t ticket;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Admission as the coordinator holds it: beyond slots + max_queued running or waiting (the gateway's
      // --max-queued travels with the request), RESOURCE_EXHAUSTED before anything is sent.
      if (request->has_max_queued() && running_ + static_cast<int>(waiting_.size()) >= o_.slots + request->max_queued()) {
        ++rejected_;
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "the server is overloaded: " + std::to_string(running_ + waiting_.size()) +
                                " requests running or waiting, limit " + std::to_string(o_.slots) + " running + " +
                                std::to_string(request->max_queued()) + " queued (--max-queued); retry later");
      }
      ticket = next_ticket_++;
      waiting_.push_back(ticket);
      writer->SendInitialMetadata();  // admitted (the coordinator does the same)
      while (!(waiting_.front() == ticket && running_ < o_.slots)) {
        cv_.wait_for(lock, std::chrono::milliseconds(20));
        if (context->IsCancelled()) {
          waiting_.erase(std::find(waiting_.begin(), waiting_.end(), ticket));
          ++aborted_;
          cv_.notify_all();
          return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while waiting");
        }
      }
      waiting_.pop_front();
      ++running_;
      prefix_queries_ += prompt.size();
      cv_.notify_all();
    }
    const double queue_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - arrival).count();
    auto release = [&] {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
      cv_.notify_all();
    };
    const int max_tokens = request->sampling().max_tokens() > 0 ? request->sampling().max_tokens()
                                                                : o_.max_model_len - prompt.size();
    std::set<int> stop_ids(request->sampling().stop_token_ids().begin(), request->sampling().stop_token_ids().end());
    size_t next = 0;
    int produced = 0;
    bool first = true;
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(o_.step_ms));
      if (context->IsCancelled()) {
        std::lock_guard<std::mutex> lock(mu_);
        ++aborted_;
        --running_;
        cv_.notify_all();
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      }
      GenerateResponse out;
      out.set_request_id(request->request_id());
      FinishReason finish = FINISH_NONE;
      for (int k = 0; k < o_.tokens_per_step && finish == FINISH_NONE; ++k) {
        int token = next < reply.size() ? reply[next++] : o_.eos_token_id;
        if (o_.emit_invalid_token && produced == 1) token = 1 << 30;
        out.add_token_ids(token);
        ++produced;
        if (token == o_.eos_token_id && !request->sampling().ignore_eos()) finish = FINISH_STOP;
        else if (stop_ids.count(token)) finish = FINISH_STOP;
        else if (produced >= max_tokens) finish = FINISH_LENGTH;
        if (request->sampling().want_logprobs() || request->sampling().logprobs() > 0) {
          auto* lp = out.add_logprobs();
          lp->set_token_id(token);
          lp->set_logprob(-0.25f);
          for (int t = 0; t < request->sampling().logprobs(); ++t) {
            auto* top = lp->add_top();
            top->set_token_id(t == 0 ? token : token + t);
            top->set_logprob(-0.25f - t);
          }
        }
      }
      out.set_finish_reason(finish);
      out.set_prompt_tokens(prompt.size());
      out.set_completion_tokens(produced);
      if (first) {
        out.set_queue_time_s(queue_s);
        first = false;
      }
      if (o_.tokens_per_step > 1) {
        out.set_num_draft_tokens(o_.tokens_per_step - 1);
        out.set_num_accepted_tokens(out.token_ids_size() - 1);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        generated_ += out.token_ids_size();
        if (o_.tokens_per_step > 1) {
          ++drafts_;
          draft_tokens_ += o_.tokens_per_step - 1;
          accepted_ += out.token_ids_size() - 1;
          accepted_per_pos_.resize(o_.tokens_per_step - 1);
          for (int pos = 0; pos + 1 < out.token_ids_size(); ++pos) ++accepted_per_pos_[pos];
        }
      }
      if (!writer->Write(out)) {
        release();
        return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      }
      if (finish != FINISH_NONE) break;
    }
    release();
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext*, const StatsRequest*, StatsResponse* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->set_ready(!o_.not_ready);
    if (o_.not_ready) out->set_not_ready_reason("fixture started with --not-ready");
    out->set_num_requests_running(running_);
    out->set_num_requests_waiting(waiting_.size());
    out->set_kv_cache_usage_perc(static_cast<double>(running_) / o_.slots);
    out->set_prefix_cache_queries(prefix_queries_);
    out->set_prefix_cache_hits(0);
    out->set_spec_decode_num_drafts(drafts_);
    out->set_spec_decode_num_draft_tokens(draft_tokens_);
    out->set_spec_decode_num_accepted_tokens(accepted_);
    for (int64_t n : accepted_per_pos_) out->add_spec_decode_num_accepted_tokens_per_pos(n);
    // Every verification step of the fixture keeps all drafts: a "full" decision each.
    for (const char* d : {"full", "reduced", "off", "probe", "calibrate"})
      (*out->mutable_spec_decode_draft_decisions())[d] = std::string(d) == "full" ? drafts_ : 0;
    out->set_max_model_len(o_.max_model_len);
    out->set_max_num_seqs(o_.slots);
    out->set_num_requests_rejected(rejected_);
    out->set_world(1);
    auto* w = out->add_workers();
    w->set_rank(0);
    return grpc::Status::OK;
  }

 private:
  std::vector<int> Reply(const GenerateRequest& request) const {
    const auto& p = request.prompt_token_ids();
    int begin = 0, end = p.size();
    if (p.size() && p[0] == o_.bos_token_id) begin = 1;
    for (int i = p.size() - 1; i >= 0; --i) {
      if (p[i] == o_.user_token_id) {
        begin = i + 1;
        for (int j = i + 1; j < p.size(); ++j)
          if (p[j] == o_.assistant_token_id) {
            end = j;
            break;
          }
        break;
      }
    }
    std::vector<int> reply(p.begin() + begin, p.begin() + end);
    if (request.sampling().temperature() > 0 && !reply.empty()) {
      uint64_t offset = request.sampling().has_seed() ? request.sampling().seed() : std::random_device{}();
      std::rotate(reply.begin(), reply.begin() + offset % reply.size(), reply.end());
    }
    return reply;
  }

  const Options o_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> waiting_;
  uint64_t next_ticket_ = 0;
  int running_ = 0;
  std::vector<int64_t> accepted_per_pos_;
  int64_t rejected_ = 0;
  int64_t aborted_ = 0, generated_ = 0, prefix_queries_ = 0, drafts_ = 0, draft_tokens_ = 0, accepted_ = 0;
};

}  // namespace
}  // namespace dsmesh

int main(int argc, char** argv) {
  using dsmesh::Flags;
  try {
    Flags flags(std::vector<std::string>(argv + 1, argv + argc),
                {"listen", "user-token-id", "assistant-token-id", "bos-token-id", "eos-token-id", "slots", "step-ms",
                 "tokens-per-step", "max-model-len", "not-ready", "emit-invalid-token"},
                {"not-ready", "emit-invalid-token"});
    dsmesh::Options o;
    o.user_token_id = flags.GetInt("user-token-id", -1);
    o.assistant_token_id = flags.GetInt("assistant-token-id", -1);
    o.bos_token_id = flags.GetInt("bos-token-id", 0);
    o.eos_token_id = flags.GetInt("eos-token-id", 1);
    o.slots = flags.GetInt("slots", 4);
    o.step_ms = flags.GetInt("step-ms", 10);
    o.tokens_per_step = flags.GetInt("tokens-per-step", 1);
    o.max_model_len = flags.GetInt("max-model-len", 4096);
    o.not_ready = flags.GetBool("not-ready", false);
    o.emit_invalid_token = flags.GetBool("emit-invalid-token", false);
    dsmesh::ParrotService service(o);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(flags.Get("listen", "127.0.0.1:0"), grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
    auto server = builder.BuildAndStart();
    if (!server || port == 0) {
      std::fprintf(stderr, "parrot_generate_server: cannot listen on %s\n", flags.Get("listen", "127.0.0.1:0").c_str());
      return 1;
    }
    std::printf("PORT %d\n", port);
    std::fflush(stdout);
    server->Wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parrot_generate_server: %s\n", e.what());
    return 2;
  }
}

#include "cli/bench/decode_stream_phase.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "cli/bench/bench_clock.h"

namespace dsmesh {
namespace {

// What the stream's callbacks (gRPC threads) hand to the bench's thread.
struct StreamState {
  std::mutex mu;
  std::condition_variable cv;
  // One per response that carried tokens: seconds since the phase's clock started, and how many tokens
  // (more than one only with speculative decoding: a step's accepted drafts come together).
  std::vector<double> times;
  std::vector<int> tokens;
  std::string error;                // a response's error
  FinishReason finish = FINISH_NONE;
  bool done = false;
  grpc::Status status;
};

}  // namespace

DecodeStreamPhase RunDecodeStreamPhase(MeshClient& stream_client, MeshClient& long_client,
                                       const GenerateRequest& stream, const GenerateRequest& long_prompt,
                                       int alone_gaps, std::chrono::seconds timeout) {
  auto state = std::make_shared<StreamState>();
  const auto t0 = BenchClock::now();
  std::shared_ptr<GenerateCall> call = stream_client.Generate(
      stream,
      [state, t0](const GenerateResponse& r) {
        const double t = SecondsSince(t0);
        std::lock_guard<std::mutex> lock(state->mu);
        if (r.token_ids_size() > 0) {
          state->times.push_back(t);
          state->tokens.push_back(r.token_ids_size());
        }
        if (!r.error().empty()) state->error = r.error();
        if (r.finish_reason() != FINISH_NONE) state->finish = r.finish_reason();
        state->cv.notify_all();
      },
      [state](const grpc::Status& s) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->done = true;
        state->status = s;
        state->cv.notify_all();
      });
  auto stream_failure = [&]() -> std::string {  // state->mu held
    if (!state->error.empty()) return state->error;
    if (state->finish == FINISH_ABORT) return "aborted";
    if (state->done && !state->status.ok() && state->status.error_code() != grpc::StatusCode::CANCELLED)
      return std::to_string(state->status.error_code()) + " " + state->status.error_message();
    return "";
  };
  auto cancel_and_wait = [&] {
    call->Cancel();
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->done; });
  };

  // The stream decodes alone first.
  {
    std::unique_lock<std::mutex> lock(state->mu);
    const bool ready = state->cv.wait_for(lock, timeout, [&] {
      return state->done || static_cast<int>(state->times.size()) > alone_gaps;
    });
    const std::string failure = stream_failure();
    const bool ended = state->done;
    lock.unlock();
    if (!ready || ended || !failure.empty()) {
      if (!ended) cancel_and_wait();
      throw std::runtime_error("the decoding stream " +
                               (!failure.empty() ? "failed: " + failure
                                : ended ? std::string("ended before the long prompt was sent")
                                        : "did not produce " + std::to_string(alone_gaps + 1) + " responses in " +
                                              std::to_string(timeout.count()) + " s"));
    }
  }

  // The long prompt beside it.
  const double sent = SecondsSince(t0);
  GenerateResult long_result;
  try {
    long_result = long_client.Generate(long_prompt);
  } catch (...) {
    cancel_and_wait();
    throw;
  }
  cancel_and_wait();
  if (long_result.finish == FINISH_ABORT || long_result.tokens.empty())
    throw std::runtime_error("the long prompt (beside the decoding stream) failed: " + long_result.error);
  DecodeStreamPhase out;
  out.long_ttft_s = long_result.token_times.front();
  const double first = sent + out.long_ttft_s;

  std::vector<double> times;
  std::vector<int> tokens;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    const std::string failure = stream_failure();
    if (!failure.empty()) throw std::runtime_error("the decoding stream failed: " + failure);
    times = state->times;
    tokens = state->tokens;
    out.stream_ended_early = state->finish != FINISH_NONE && (times.empty() || times.back() < first);
  }
  for (size_t i = 1; i < times.size(); ++i) {  // times[0] is the stream's own TTFT, not a gap
    const double gap = (times[i] - times[i - 1]) / tokens[i];
    if (static_cast<int>(i) <= alone_gaps) out.alone_gaps_s.push_back(gap);  // all before `sent`
    else if (times[i - 1] >= sent && times[i] <= first) out.beside_gaps_s.push_back(gap);
  }

  // The next phase starts on an idle engine: the cancelled stream has left the scheduler.
  const auto deadline = BenchClock::now() + std::chrono::seconds(10);
  for (;;) {
    const StatsResponse s = stream_client.Stats();
    if (s.num_requests_running() == 0 && s.num_requests_waiting() == 0) break;
    if (BenchClock::now() > deadline)
      throw std::runtime_error("the cancelled decoding stream still runs in the coordinator after 10 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

}  // namespace dsmesh

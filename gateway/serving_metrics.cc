#include "gateway/serving_metrics.h"

#include <map>

namespace dsmesh {

namespace {

// Bucket bounds copied as numbers from vLLM's loggers.py (facts, not code).
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestLatencyBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                                    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

}  // namespace

ServingMetrics::ServingMetrics(std::string model_name, int max_model_len)
    : model_name_(std::move(model_name)),
      ttft_(kTtftBuckets),
      itl_(kItlBuckets),
      e2e_(kRequestLatencyBuckets),
      queue_(kRequestLatencyBuckets),
      inference_(kRequestLatencyBuckets),
      prefill_(kRequestLatencyBuckets),
      decode_(kRequestLatencyBuckets),
      prompt_len_(Buckets125(max_model_len)),
      generation_len_(Buckets125(max_model_len)),
      max_tokens_param_(Buckets125(max_model_len)) {
  for (const char* reason : {"stop", "length", "abort", "error"}) request_success_[reason];
  for (const char* reason : {"queue_full", "not_ready"}) rejected_[reason];
}

void ServingMetrics::ObserveInterTokenLatency(double seconds) { itl_.Observe(seconds); }

void ServingMetrics::ObserveFinished(const FinishedRequestFigures& f) {
  prompt_tokens_.Add(f.prompt_tokens);
  generation_tokens_.Add(f.generation_tokens);
  image_inputs_.Add(f.image_inputs);
  image_tokens_.Add(f.image_tokens);
  malformed_tool_call_blocks_.Add(f.malformed_tool_call_blocks);
  suppressed_tool_calls_.Add(f.suppressed_tool_calls);
  {
    std::lock_guard<std::mutex> lock(mu_);
    request_success_[f.finished_reason].Add(1);
  }
  if (f.ttft_s) ttft_.Observe(*f.ttft_s);
  e2e_.Observe(f.e2e_s);
  if (f.queue_s) {
    queue_.Observe(*f.queue_s);
    inference_.Observe(std::max(0.0, f.e2e_s - *f.queue_s));
  }
  if (f.prefill_s) prefill_.Observe(*f.prefill_s);
  if (f.decode_s) decode_.Observe(*f.decode_s);
  prompt_len_.Observe(f.prompt_tokens);
  generation_len_.Observe(f.generation_tokens);
  if (f.max_tokens_param > 0) max_tokens_param_.Observe(f.max_tokens_param);
}

void ServingMetrics::CountHttpRequest(const std::string& handler, const std::string& method, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  http_requests_[{handler, method, status}].Add(1);
}

void ServingMetrics::CountRejected(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  rejected_[reason].Add(1);
}

std::string ServingMetrics::Render(const std::optional<StatsResponse>& stats, int gateway_in_flight) const {
  std::string out;
  const Labels base = Base();
  auto gauge = [&](const std::string& name, const std::string& help, double v) {
    PromFamilyHeader(name, "gauge", help, &out);
    PromSample(name, base, v, &out);
  };
  // Counter families are announced under their _total name, as prometheus_client (vLLM) writes the
  // 0.0.4 text format; promtool and Prometheus expect exactly that.
  auto counter = [&](const std::string& name, const std::string& help, double v) {
    PromFamilyHeader(name + "_total", "counter", help, &out);
    PromSample(name + "_total", base, v, &out);
  };
  auto histogram = [&](const std::string& name, const std::string& help, const Histogram& h) {
    PromFamilyHeader(name, "histogram", help, &out);
    h.Render(name, base, &out);
  };

  gauge("dsmesh_coordinator_up", "1 when the coordinator answered the Stats RPC for this scrape.", stats ? 1 : 0);
  gauge("dsmesh_gateway_requests_in_flight", "Requests this gateway has taken (handed to the coordinator) and not finished.",
        gateway_in_flight);
  if (stats) {
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", stats->num_requests_running());
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats->num_requests_waiting());
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats->kv_cache_usage_perc());
    counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
            stats->prefix_cache_queries());
    counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            stats->prefix_cache_hits());
    counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", stats->spec_decode_num_drafts());
    counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", stats->spec_decode_num_draft_tokens());
    counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
            stats->spec_decode_num_accepted_tokens());
    counter("dsmesh_spec_decode_draft_passes", "MTP draft passes run (one per draft position, batched over sequences).",
            stats->spec_decode_draft_passes());
    counter("dsmesh_spec_decode_draft_seconds", "Rank 0 time in MTP draft passes (window catch-up included).",
            stats->spec_decode_draft_seconds_sum());
    counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", stats->num_preemptions());
    counter("dsmesh_mixed_step_prefill_caps", "Steps whose prefill tokens --max-decode-slowdown cut beside decoding "
            "sequences.", stats->mixed_step_prefill_caps());
    gauge("dsmesh_mesh_world_size", "Worker ranks in the mesh.", stats->world());
    gauge("dsmesh_mesh_epoch", "Times the mesh was (re)formed.", stats->mesh_epoch());
    counter("dsmesh_worker_restarts", "Worker processes that registered for a rank an earlier process held "
            "(restarted workers), since the coordinator started.", stats->worker_restarts());
    counter("dsmesh_engine_steps", "Engine steps run by the coordinator.", stats->steps());
    gauge("dsmesh_coordinator_max_queued", "Admission bound: max_num_seqs + this many requests may run or wait "
          "(shared by every gateway).", stats->max_queued());
    counter("dsmesh_coordinator_requests_rejected", "Requests the coordinator refused at admission (queue full), "
            "from every gateway.", stats->num_requests_rejected());
    counter("dsmesh_cancelled_requests_freed", "Requests whose client went away and whose slot and KV blocks the "
            "scheduler released.", stats->num_cancelled_requests());
    gauge("dsmesh_cancel_free_steps_max", "Most engine steps planned with a cancelled request after its cancel "
          "was seen (0: freed by the next plan).", stats->cancel_free_steps_max());
    counter("dsmesh_step_wall_seconds", "Step time, plan written to every rank's result received.",
            stats->step_wall_seconds_sum());
    counter("dsmesh_step_forward_seconds", "Rank 0 forward time, collectives excluded.", stats->forward_seconds_sum());
    counter("dsmesh_step_collective_seconds", "Rank 0 time inside collectives.", stats->collective_seconds_sum());
    counter("dsmesh_step_sample_seconds", "Rank 0 sampling time.", stats->sample_seconds_sum());
    counter("dsmesh_step_schedule_seconds", "Coordinator time building plans and applying results.",
            stats->schedule_seconds_sum());
    PromFamilyHeader("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                     "Accepted tokens per draft position.", &out);
    for (int pos = 0; pos < stats->spec_decode_num_accepted_tokens_per_pos_size(); ++pos) {
      Labels l = base;
      l.emplace_back("position", std::to_string(pos));
      PromSample("vllm:spec_decode_num_accepted_tokens_per_pos_total", l,
                 stats->spec_decode_num_accepted_tokens_per_pos(pos), &out);
    }
    if (!stats->spec_decode_draft_decisions().empty()) {
      // The speculation policy's decisions (coordinator/draft_policy.h), one per decoding sequence and step.
      PromFamilyHeader("vllm:spec_decode_draft_decisions_total", "counter",
                       "Draft policy decisions per decoding sequence and step: full, reduced, off (fewer or no "
                       "drafts where acceptance does not pay for them), probe, calibrate.", &out);
      const std::map<std::string, int64_t> sorted(stats->spec_decode_draft_decisions().begin(),
                                                  stats->spec_decode_draft_decisions().end());
      for (const auto& [decision, n] : sorted) {
        Labels l = base;
        l.emplace_back("decision", decision);
        PromSample("vllm:spec_decode_draft_decisions_total", l, n, &out);
      }
    }
    PromFamilyHeader("dsmesh_worker_step_time_seconds_total", "counter", "Time workers spent executing steps, per rank.",
                     &out);
    for (const auto& w : stats->workers())
      PromSample("dsmesh_worker_step_time_seconds_total", {{"model_name", model_name_}, {"rank", std::to_string(w.rank())}},
                 w.step_time_seconds_sum(), &out);
    PromFamilyHeader("dsmesh_worker_steps_total", "counter", "Steps executed, per worker rank.", &out);
    for (const auto& w : stats->workers())
      PromSample("dsmesh_worker_steps_total", {{"model_name", model_name_}, {"rank", std::to_string(w.rank())}},
                 w.step_count(), &out);
    PromFamilyHeader("dsmesh_worker_collective_time_seconds_total", "counter",
                     "Time workers spent in collectives (all-reduce etc.), per rank.", &out);
    for (const auto& w : stats->workers())
      PromSample("dsmesh_worker_collective_time_seconds_total",
                 {{"model_name", model_name_}, {"rank", std::to_string(w.rank())}}, w.collective_time_seconds_sum(),
                 &out);
  }
  counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt_tokens_.value());
  counter("vllm:generation_tokens", "Number of generation tokens processed.", generation_tokens_.value());
  counter("dsmesh_image_inputs", "Number of images in prompts processed.", image_inputs_.value());
  counter("dsmesh_image_tokens", "Number of prefill tokens of image blocks processed (part of vllm:prompt_tokens).",
          image_tokens_.value());
  counter("dsmesh_malformed_tool_call_blocks", "DSML tool-call blocks in the model's output that did not parse: their "
          "text was returned as content (removed for tool_choice none).", malformed_tool_call_blocks_.value());
  counter("dsmesh_suppressed_tool_calls", "Well-formed tool calls the model wrote that were not returned because the "
          "request had no tools or tool_choice none.", suppressed_tool_calls_.value());
  {
    std::lock_guard<std::mutex> lock(mu_);
    PromFamilyHeader("vllm:request_success_total", "counter", "Count of successfully processed requests.", &out);
    for (const auto& [reason, c] : request_success_) {
      Labels l = base;
      l.emplace_back("finished_reason", reason);
      PromSample("vllm:request_success_total", l, c.value(), &out);
    }
    PromFamilyHeader("dsmesh_requests_rejected_total", "counter", "Requests refused before reaching the mesh, by reason.",
                     &out);
    for (const auto& [reason, c] : rejected_) {
      Labels l = base;
      l.emplace_back("reason", reason);
      PromSample("dsmesh_requests_rejected_total", l, c.value(), &out);
    }
    PromFamilyHeader("dsmesh_http_requests_total", "counter", "HTTP requests by handler, method and status.", &out);
    for (const auto& [key, c] : http_requests_) {
      const auto& [handler, method, status] = key;
      PromSample("dsmesh_http_requests_total",
                 {{"handler", handler}, {"method", method}, {"status", std::to_string(status)}}, c.value(), &out);
    }
  }
  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
  histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_);
  histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_);
  histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", queue_);
  histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
            inference_);
  histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", prefill_);
  histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", decode_);
  histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_len_);
  histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", generation_len_);
  histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", max_tokens_param_);
  return out;
}

}  // namespace dsmesh

// What the HTTP modes of `dsmesh bench` (url_bench.cc, url_load_bench.cc) do with an OpenAI endpoint: their
// shared flags, one streaming request timed event by event, the /metrics counters around a run, and the
// served model's name.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cli/bench/bench_clock.h"
#include "common/flags.h"
#include "common/http_client.h"

namespace dsmesh {

// The flags of `bench --url` in either HTTP mode (each mode reads its own; the other's are accepted).
Flags ParseUrlBenchFlags(const std::vector<std::string>& args);

// --url's endpoint; throws UsageError when --url is missing or not an http:// URL.
HttpEndpoint EndpointFromFlags(const Flags& flags);

// --api-key, else $DSMESH_API_KEY, else none.
std::string ApiKeyFromFlags(const Flags& flags);

// --model, else the first model the endpoint's /v1/models lists. Throws std::runtime_error naming `url`
// when that list cannot be read.
std::string ServedModel(const Flags& flags, const HttpEndpoint& endpoint, const std::string& api_key);

struct StreamResult {
  int status = 0;      // HTTP status (0: no answer)
  double start_s = 0;  // request sent
  double ttft_s = -1;  // first content/reasoning delta
  double last_s = 0;   // last delta
  double end_s = 0;
  int tokens = 0;      // usage.completion_tokens (never chunk counts: a speculative step sends several tokens)
  int prompt_tokens = 0;
  std::vector<double> chunk_s;  // arrival of each event carrying output
  std::string error;
};

// One streaming request (`body` POSTed to `path`: chat or completions) read as server-sent events; times in
// seconds from `t0`. `timeout_s` bounds the whole exchange so a hung server ends the run with an error
// instead of a hang. Errors are returned in StreamResult::error, never thrown.
StreamResult RunStream(const HttpEndpoint& e, const std::string& body, const std::string& api_key,
                       BenchClock::time_point t0, const std::string& path = "/v1/chat/completions",
                       int timeout_s = 600);

// The sum over all series of each metric on /metrics (empty when /metrics cannot be read).
std::map<std::string, double> ReadMetrics(const HttpEndpoint& e);

// `name`'s value in a ReadMetrics map, 0 when absent.
double MetricValue(const std::map<std::string, double>& metrics, const std::string& name);

}  // namespace dsmesh

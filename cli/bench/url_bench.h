// `dsmesh bench --url http://HOST:PORT`: the HTTP modes of `dsmesh bench`, against any OpenAI endpoint
// (cli/bench/bench_mode.h picks between them).
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// The reference deployment's serving benchmark (url_bench.cc): TTFT, decode tok/s and acceptance per
// prompt and stream count, beside the reference deployment's figures.
int RunUrlBench(const std::vector<std::string>& args);

// With --clients N, the load run (url_load_bench.cc): TTFT / inter-token latency p50/p99, throughput and
// the 429 count under N concurrent streaming clients. Exit status 1 when a request failed.
int RunUrlLoadBench(const std::vector<std::string>& args);

}  // namespace dsmesh

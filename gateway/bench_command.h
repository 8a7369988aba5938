// `dsmesh bench --url http://HOST:PORT`: the serving benchmark against any OpenAI endpoint (cli/commands.cc
// hands `bench` runs with --url here).
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// The streams run (TTFT, decode tok/s, acceptance beside the reference deployment), or with --clients N
// the load run.
int RunUrlBench(const std::vector<std::string>& args);

}  // namespace dsmesh

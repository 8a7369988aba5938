// `dsmesh bench --device cpu|cuda[:N] --model DIR|synthetic:...` without a mesh: decode steps of the model
// in this process beside their floor (model/roofline.h).
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// ms/step and tok/s at each --streams count and --contexts length, prefill tok/s, state cost per KV dtype,
// device memory; with --profile the step split per phase and op.
int RunInProcessBench(const std::vector<std::string>& args);

}  // namespace dsmesh

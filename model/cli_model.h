// The model a single-process CLI command runs: `--model DIR|synthetic:...`, `--device cpu|cuda[:N]`
// (default cpu), `--threads T` (CPU), `--enforce-eager` (no CUDA graphs). Throws UsageError on a bad
// --device, and names the device when no GPU is visible.
#pragma once

#include <memory>

#include "common/flags.h"
#include "model/model.h"

namespace dsmesh {

std::unique_ptr<Model> LoadForCli(const Flags& f);

}  // namespace dsmesh

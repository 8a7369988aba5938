// The model a single-process CLI command runs: `--model DIR|synthetic:...`, `--device cpu|cuda[:N]`
// (default: ChooseDevice's, a CUDA GPU when one is visible, else the CPU; "[load] device: ..." on stderr
// says which and why), `--threads T` (CPU), `--enforce-eager` (no CUDA graphs). Throws UsageError on a bad
// --device, names the device when no GPU is visible, and refuses a model too large for the GPU before
// uploading it (model/gpu_fit.h); `--kv-cache-dtype` sets the state pool's KV row type (model/kv_layout.h).
#pragma once

#include <memory>

#include "common/flags.h"
#include "model/model.h"

namespace dsmesh {

std::unique_ptr<Model> LoadForCli(const Flags& f);

}  // namespace dsmesh

// Synthetic models: `--model synthetic:NAME[:seed=S,experts=K,dense=K,layer.N=K,mtp=K]` builds a model's
// weights from a seed instead of reading files, in the memory of the backend that runs it (the CUDA
// backend generates EXL3 trellises on the device), each rank only its shard. NAME is `v4-flash` (the
// DeepSeek-V4-Flash config of docs/model-v4.md section 1) or a directory holding a config.json. The linears a
// pack quantizes (kernels/exl3/quant_plan.h) become synthetic MCG EXL3 of the given bits (defaults: the
// reference deployment's experts=2, dense=6: docs/reference-deployment.md); router, norms,
// hyper-connections, embedding and head are bf16/f32.
// Values are scaled so activations stay finite through every layer (see synthetic.cc).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/testing/synthetic_source.h"

namespace dsmesh {

ModelConfig SyntheticConfig(const SyntheticSpec& spec);

// A tensor's own seed: the spec's seed mixed with the tensor's name (FNV-1a, stable across builds).
uint64_t SyntheticSeed(const SyntheticSpec& spec, const std::string& name);

}  // namespace dsmesh

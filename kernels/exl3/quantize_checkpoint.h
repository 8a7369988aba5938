// `dsmesh quantize`: a bf16/fp16/fp32 DeepSeek-V4 checkpoint (DeepSeek naming) -> an EXL3 pack.
// Routed experts, dense linears and (with head=K) the lm head become EXL3 tensor sets (quant_plan.h); with
// embed=fp8 the embedding becomes F8_E4M3 + per-row scale (common/fp8_blocks.h); everything else is copied
// as stored. Output: safetensors shard(s) (+ index when several), config.json with a quantization_config
// block, quantization_config.json with per-tensor storage, and every other file of the input directory
// (tokenizer, chat template, generation config). The pack is built in a temporary sibling directory and
// renamed into place, so an interrupted run never leaves a half-written OUT.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/exl3/codebook.h"
#include "kernels/exl3/pack_size.h"
#include "kernels/exl3/quant_plan.h"

namespace dsmesh {

struct QuantizeCheckpointOptions {
  std::string model_dir, out_dir;
  Exl3BitsSpec bits;
  Exl3Codebook codebook = Exl3Codebook::kMcg;
  bool force = false;                      // replace an existing out_dir
  int64_t shard_bytes = 8192ll << 20;      // exllamav3's default shard size
  bool progress = true;                    // progress bar on stderr
  bool size_only = false;                  // plan, validate and size the pack; encode and write nothing
};

struct QuantizeCheckpointSummary {
  int64_t tensors_quantized = 0, tensors_kept = 0, tiles = 0;
  double average_bits = 0;  // over quantized linears, weighted by weights (padding excluded)
  double seconds = 0;
  int shards = 0;
  PackBytes planned_bytes;   // tensor bytes by class computed from the plan and shapes (also with size_only)
  PackBytes bytes;           // tensor bytes written, by class (equals planned_bytes)
  int64_t file_bytes = 0;    // the safetensors shards on disk (tensor bytes + headers)
};

QuantizeCheckpointSummary QuantizeCheckpoint(const QuantizeCheckpointOptions& options);

}  // namespace dsmesh

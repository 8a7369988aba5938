// The floor of one decode step of a DeepSeek-V4 model on one GPU rank: the bytes the step must read (the
// weights this batch touches: every dense linear, the routed experts the batch's rows are expected to
// hit, the head; the KV state at the given context) over the copy bandwidth, and the EXL3 decode work
// (integer instructions per weight, kernels/exl3/decode_cost.h) over the integer rate. A benchmark
// prints measured time / max(floors) beside every figure.
//
// Layout assumptions (model/model.h): attention heads, wq_b/wo_a/wo_b, the head's vocabulary rows and
// the experts' intermediate dimension are split across the N ranks; wq_a, wkv, compressors, indexer,
// router and hyper-connections are replicated; the KV state is replicated (single shared K=V head).
// Expected distinct experts for R rows of top-k routing over E experts: E (1 - (1 - k/E)^R) (uniform).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/exl3/quant_plan.h"
#include "model/config.h"
#include "model/kv_layout.h"

namespace dsmesh {

// Ceilings of the GPU. Defaults: one H200 as measured in kernels/cuda/testdata/anchors-h200.json
// (device-to-device copy 4.3 TB/s; LOP3 16.47 Tops/s, 132 SMs at 1.98 GHz).
struct RooflineCeilings {
  double copy_bytes_per_s = 4.3e12;
  double int_ops_per_s = 16.47e12;
};

struct DecodeStepShape {
  int streams = 1;           // decoding sequences
  int rows_per_stream = 1;   // 1, or 1 + drafts (verification)
  int64_t context = 4096;    // tokens already in each sequence
  int world = 1;             // tensor-parallel ranks
  KvCacheDtype kv = KvCacheDtype::kBf16;
};

struct DecodeStepFloor {
  double dense_bytes = 0, expert_bytes = 0, head_bytes = 0, small_bytes = 0, kv_bytes = 0;
  double exl3_weights = 0;   // EXL3 weights decoded (for the op floor)
  double decode_ops = 0;     // dense_ops + expert_ops + head_ops
  double dense_ops = 0, expert_ops = 0, head_ops = 0;
  double expected_experts_per_layer = 0;
  double byte_floor_s = 0, op_floor_s = 0;
  double bytes() const { return dense_bytes + expert_bytes + head_bytes + small_bytes + kv_bytes; }
  double floor_s() const { return byte_floor_s > op_floor_s ? byte_floor_s : op_floor_s; }
  std::string Describe() const;  // one line
};

// bits: the pack's K per class (experts, dense, per-layer overrides); linears a pack keeps dense, and
// every linear when bits.experts = bits.dense = 0 (a bf16 checkpoint), count as bf16.
DecodeStepFloor ComputeDecodeStepFloor(const ModelConfig& c, const Exl3BitsSpec& bits, const DecodeStepShape& shape,
                                       const RooflineCeilings& ceilings = {});

}  // namespace dsmesh

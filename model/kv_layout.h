// What one sequence's attention state costs, per layer kind and storage dtype (docs/model-v4.md section 4):
// the sliding-window ring of every layer, the compressed entries (ratio 4: CSA, ratio 128: HCA), the
// indexer keys of CSA layers, and each compressor's open partial window (kept in f32 in every layout,
// as vLLM and DeepSeek's reference keep it). The attention is single-head shared-KV, so with heads split
// across tensor-parallel ranks every rank holds every entry: the figures are per rank at any TP size.
//
// Storage of one 512-wide entry (window rows use the same form):
//   f32   what the forward stores today (4 B x head_dim);
//   bf16  2 B x head_dim;
//   fp8   the non-rope dims as fp8 e4m3 with one f32 scale per row, the rope dims in bf16
//         (head_dim - rope_dim + 4 + 2 x rope_dim bytes: 580 B for V4-Flash).
// An indexer key is 4 B / 2 B x index_head_dim, or fp8 with one f32 scale (132 B for V4-Flash).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace dsmesh {

enum class KvCacheDtype { kF32, kBf16, kFp8 };

// --kv-cache-dtype as vLLM spells it: "auto" (the dtype the forward computes in: f32), "bf16", "fp8" /
// "fp8_e4m3" (and "f32").
// Throws std::invalid_argument naming the value otherwise.
KvCacheDtype ParseKvCacheDtype(const std::string& value);
const char* KvCacheDtypeName(KvCacheDtype d);

struct KvLayerKind {
  std::string name;           // "sliding", "csa", "hca", "mtp"
  int layers = 0;
  int ratio = 0;              // 0 for window-only kinds
  double bytes_per_token = 0;  // compressed entries + indexer keys, per token of context, all layers of the kind
  int64_t window_bytes = 0;    // the rings of all layers of the kind (fixed per sequence)
  int64_t partial_bytes = 0;   // the compressors' open windows (fixed per sequence)
  int64_t history_bytes = 0;   // mtp: the f32 residual rows (+ token; vision: + image row and flag) it drafts
                               // from (a window per MTP block)
};

struct KvLayout {
  KvCacheDtype dtype = KvCacheDtype::kF32;
  int block_tokens = 256;     // a multiple of both ratios (vLLM's logical block for V4)
  int64_t entry_bytes = 0, indexer_key_bytes = 0, window_row_bytes = 0;
  std::vector<KvLayerKind> kinds;

  double BytesPerToken() const;
  int64_t FixedBytesPerSequence() const;  // windows + partial windows
  // State of one sequence of `tokens` tokens (entries rounded down to completed windows, as emitted).
  double SequenceBytes(int64_t tokens) const;
  // One block of block_tokens tokens across every layer (the unit a paged pool allocates).
  double BlockBytes() const { return BytesPerToken() * block_tokens; }
  // A few lines: per kind, then totals and the cost of `context` tokens.
  std::string Describe(int64_t context) const;
};

// with_mtp: include the MTP block's window (speculative decoding keeps one MTP state per sequence).
// spare_slots: rows each ring and open window keeps beyond its span so that rows written for k drafts
// never overwrite rows still needed after a rollback (speculation with k drafts: k); with spare slots
// the MTP block also keeps its input history.
KvLayout ComputeKvLayout(const ModelConfig& c, KvCacheDtype dtype, bool with_mtp = true, int spare_slots = 0);

}  // namespace dsmesh

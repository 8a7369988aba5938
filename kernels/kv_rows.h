// How one row of the state pool's length-proportional part (a compressed entry, an indexer key) is
// stored (--kv-cache-dtype; model/kv_layout.h costs the same layouts):
//   F32   dim f32 values (what the forward computes in);
//   BF16  dim bf16 values;
//   U8    the fp8 layout: the first dim - rope_dim values as fp8 e4m3 over one f32 scale (the row's largest
//         magnitude / 448, so the largest value maps to e4m3's largest finite), then the scale, then the
//         rope_dim rope values in bf16 (DeepSeek's and vLLM's split: rope dims keep more precision).
//         dim - rope_dim + 4 + 2 rope_dim bytes (580 for a V4-Flash entry, 132 for an indexer key).
// Rows are written once (when a compressor emits them) and read by attention and the indexer.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace dsmesh {

int64_t KvRowBytes(DType storage, int64_t dim, int64_t rope_dim);
// src [rows, dim] f32 -> dst, rows of KvRowBytes bytes.
void EncodeKvRows(const float* src, int64_t rows, int64_t dim, int64_t rope_dim, DType storage, void* dst);
// The inverse (exact for F32; BF16 and U8 give the stored values back).
void DecodeKvRows(const void* src, int64_t rows, int64_t dim, int64_t rope_dim, DType storage, float* dst);

}  // namespace dsmesh

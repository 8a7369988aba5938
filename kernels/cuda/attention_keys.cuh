// How the attention kernels address a query row's keys (Backend::Attention): the sliding window (ring
// slots for positions before the step, the step's new rows after), then the compressed entries of a paged
// pool (all visible ones, or a row's top-k list). Shared by the split/per-row kernels
// (model_ops_attention.cu) and the tensor-core prefill kernel (model_ops_attention_prefill.cu).
#pragma once

#include <cstdint>

#include "kernels/cuda/model_ops.h"

namespace dsmesh::cuda_ops {

struct RowSpan {
  int64_t lo = 0, nwin = 0, visible = 0, nkeys = 0;
};

// Key j of query row r: the window rows first, then the compressed entries (listed or all visible).
// Null for a listed entry that is absent or not yet visible.
struct AttnKeys {
  const float* ring;
  const float* new_kv;
  PagedRowsDev entries;
  const int32_t* topk;
  int64_t topk_cols, start, num_entries, d, ring_slots;
  int window, ratio;

  // The keys query row r sees: window positions lo .. lo + nwin - 1, then its compressed entries (the
  // visible ones, or the top-k list), nkeys in all.
  __device__ RowSpan Span(int64_t r) const {
    RowSpan sp;
    const int64_t t = start + r;
    sp.lo = t - window + 1 > 0 ? t - window + 1 : 0;
    sp.nwin = t - sp.lo + 1;
    int64_t ncomp = 0;
    if (entries.pool && ratio > 0) {
      sp.visible = min(num_entries, (t + 1) / ratio);
      ncomp = topk ? topk_cols : sp.visible;
    }
    sp.nkeys = sp.nwin + ncomp;
    return sp;
  }

  // Key j's row: window rows (j < nwin) are f32, entries are stored as entries.kind.
  __device__ const void* Key(int64_t r, int64_t lo, int64_t nwin, int64_t visible, int64_t j) const {
    if (j < nwin) {
      const int64_t p = lo + j;
      return p < start ? ring + (p % ring_slots) * d : new_kv + (p - start) * d;
    }
    const int64_t i = j - nwin;
    const int64_t e = topk ? topk[r * topk_cols + i] : i;
    return e >= 0 && e < visible ? entries.Row(e) : nullptr;
  }
  __device__ RowKind KindOf(int64_t nwin, int64_t j) const { return j < nwin ? RowKind::kF32 : entries.kind; }
};

// Whether every key row the kernel may read starts on 16 bytes (float4 loads): the ring, the step's new
// rows and the entry pool all do when head_dim is a multiple of 4 and the bases are aligned.
__device__ __forceinline__ bool AllRowsAligned(const AttnKeys& k) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return aligned(k.ring) && aligned(k.new_kv) &&
         (!k.entries.pool || k.entries.kind != RowKind::kF32 || aligned(k.entries.pool));
}

}  // namespace dsmesh::cuda_ops

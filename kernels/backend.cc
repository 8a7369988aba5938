// The Backend seam's composite ops, written with its other ops: a backend that has nothing better runs
// these (the CPU backend, the fp32 reference); a device backend overrides them with fewer launches.
#include "kernels/backend.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsmesh {

void Backend::RingWriteBatch(const std::vector<RingWrite>& writes) {
  std::vector<RowCopy> copies;
  for (const RingWrite& w : writes) {
    const int64_t slots = w.ring->shape[0];
    if (w.n > slots) throw std::logic_error("RingWriteBatch: more rows than the ring's slots");
    const int64_t first = w.pos % slots, head = std::min(w.n, slots - first);
    if (head > 0) copies.push_back({w.src, w.src_row, w.ring, first, head});
    if (w.n > head) copies.push_back({w.src, w.src_row + head, w.ring, 0, w.n - head});
  }
  CopyRowsBatch(copies);
}

void Backend::CompressorStep(const Tensor& kv, const Tensor& score, const CompressorSpec& spec,
                             const std::vector<CompressorSeq>& seqs) {
  const int ratio = spec.ratio;
  const int64_t dim = spec.dim, width = (spec.overlap ? 2 : 1) * dim;
  std::vector<RingWrite> ring_writes;
  for (const CompressorSeq& s : seqs) {
    const int64_t end = s.start + s.count, emitted = s.num_entries, emitted_after = end / ratio;
    const int64_t slots = s.pending_kv->shape[0];
    if (emitted_after > emitted) {
      // Rows for positions base .. end-1: the pending ones from the ring, then this step's.
      const int64_t base = spec.overlap ? std::max<int64_t>(emitted - 1, 0) * ratio : emitted * ratio;
      const int64_t old = s.start - base;
      if (old < 0 || old > slots) throw std::logic_error("CompressorStep: the ring does not hold the open windows");
      Tensor all_kv = Scratch(DType::kF32, {old + s.count, width});
      Tensor all_sc = Scratch(DType::kF32, {old + s.count, width});
      for (int64_t p = base; p < s.start;) {
        const int64_t slot = p % slots, run = std::min(s.start - p, slots - slot);
        CopyRows(*s.pending_kv, slot, &all_kv, p - base, run);
        CopyRows(*s.pending_score, slot, &all_sc, p - base, run);
        p += run;
      }
      CopyRows(kv, s.offset, &all_kv, old, s.count);
      CopyRows(score, s.offset, &all_sc, old, s.count);
      const int64_t fresh = emitted_after - emitted;
      Tensor entries = Scratch(DType::kF32, {fresh, dim});
      CompressorPool(all_kv, all_sc, base, emitted, fresh, ratio, spec.overlap, dim, &entries);
      RmsNorm(entries, dim, spec.norm, spec.eps, &entries);
      std::vector<int64_t> pos(fresh);
      for (int64_t i = 0; i < fresh; ++i) pos[i] = (emitted + i) * ratio;  // a window's first position
      Rope(&entries, 1, dim, spec.rope_dim, pos.data(), *spec.inv_freq, false);
      // Entry e is row e % per of block table[e / per] of the pool.
      const PagedRows& to = *s.entries;
      const int64_t per = to.rows_per_block;
      for (int64_t done = 0; done < fresh;) {
        const int64_t e = emitted + done, j = e / per, in_block = std::min(fresh - done, per - e % per);
        if (j >= to.table_len) throw std::logic_error("CompressorStep: entry past the block table");
        Tensor dst = RowView(*to.pool, static_cast<int64_t>(to.table[j]) * per, per);
        if (dst.dtype == DType::kF32) {
          CopyRows(entries, done, &dst, e % per, in_block);
        } else {  // bf16 / fp8 rows, encoded where the pool lives
          StoreKvRows(entries, done, in_block, to.rope_dim, &dst, e % per);
        }
        done += in_block;
      }
    }
    // The rings keep this step's newest rows; older pending rows stay in their slots until overwritten.
    const int64_t from = std::max(s.start, end - slots);
    ring_writes.push_back({&kv, s.offset + (from - s.start), from, end - from, s.pending_kv});
    ring_writes.push_back({&score, s.offset + (from - s.start), from, end - from, s.pending_score});
  }
  RingWriteBatch(ring_writes);
}

}  // namespace dsmesh

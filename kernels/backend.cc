// The Backend seam's composite ops, written with its other ops: a backend that has nothing better runs
// these (the CPU backend, the fp32 reference); a device backend overrides them with fewer launches.
#include "kernels/backend.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsmesh {
namespace {

// Positions pos .. pos+n-1 of a ring of `slots` slots (slot = position % slots) as at most two runs of
// consecutive slots: run(slot, offset of the run's first position from pos, rows).
template <class Run>
void ForEachRingRun(int64_t pos, int64_t n, int64_t slots, const char* who, Run run) {
  if (n > slots) throw std::logic_error(std::string(who) + ": more rows than the ring's slots");
  const int64_t first = pos % slots, head = std::min(n, slots - first);
  if (head > 0) run(first, int64_t{0}, head);
  if (n > head) run(int64_t{0}, head, n - head);
}

}  // namespace

void Backend::ArgmaxRows(const Tensor& logits, Tensor* ids) {
  const int64_t rows = logits.shape.at(0);
  if (ids->dtype != DType::kI32 || ids->numel() != rows)
    throw std::runtime_error("ArgmaxRows: ids must be i32 [" + std::to_string(rows) + "]");
  const std::vector<SampledRow> picked = SampleRows(logits, std::vector<RowSampling>(rows));  // greedy
  std::vector<int32_t> host(rows);
  for (int64_t r = 0; r < rows; ++r) host[r] = picked[r].token;
  if (rows > 0) FromHost(host.data(), ids);
}

void Backend::EmbeddingIds(const Tensor& table, const Tensor& ids, Tensor* out) {
  if (ids.dtype != DType::kI32) throw std::runtime_error("EmbeddingIds: ids must be i32");
  std::vector<int32_t> host(static_cast<size_t>(ids.numel()));
  if (!host.empty()) ToHost(ids, host.data());
  Embedding(table, host.data(), ids.numel(), out);
}

void Backend::RingWriteBatch(const std::vector<RingWrite>& writes) {
  std::vector<RowCopy> copies;
  for (const RingWrite& w : writes)
    ForEachRingRun(w.pos, w.n, w.ring->shape[0], "RingWriteBatch", [&](int64_t slot, int64_t at, int64_t rows) {
      copies.push_back({w.src, w.src_row + at, w.ring, slot, rows});
    });
  CopyRowsBatch(copies);
}

void Backend::CompressorStep(const Tensor& kv, const Tensor& score, const CompressorSpec& spec,
                             const std::vector<CompressorSeq>& seqs) {
  const int ratio = spec.ratio;
  const int64_t dim = spec.dim, width = (spec.overlap ? 2 : 1) * dim;
  if (spec.ape) {  // the rows with their position bias, then the op as for such rows
    std::vector<int64_t> positions(score.shape[0], 0);
    for (const CompressorSeq& s : seqs)
      for (int64_t i = 0; i < s.count; ++i) positions[s.offset + i] = s.start + i;
    Tensor biased = Scratch(DType::kF32, score.shape);
    CopyRows(score, 0, &biased, 0, score.shape[0]);
    AddPositionBias(&biased, *spec.ape, positions.data(), ratio);
    CompressorSpec plain = spec;
    plain.ape = nullptr;
    CompressorStep(kv, biased, plain, seqs);
    return;
  }
  std::vector<RingWrite> ring_writes;
  for (const CompressorSeq& s : seqs) {
    const int64_t end = s.start + s.count, emitted = s.num_entries, emitted_after = end / ratio;
    const int64_t slots = s.pending_kv->shape[0];
    if (emitted_after > emitted) {
      // Rows for positions base .. end-1: the pending ones from the ring, then this step's.
      const int64_t base = spec.overlap ? std::max<int64_t>(emitted - 1, 0) * ratio : emitted * ratio;
      const int64_t old = s.start - base;
      if (old < 0) throw std::logic_error("CompressorStep: the ring does not hold the open windows");
      Tensor all_kv = Scratch(DType::kF32, {old + s.count, width});
      Tensor all_sc = Scratch(DType::kF32, {old + s.count, width});
      ForEachRingRun(base, old, slots, "CompressorStep (open windows)", [&](int64_t slot, int64_t at, int64_t rows) {
        CopyRows(*s.pending_kv, slot, &all_kv, at, rows);
        CopyRows(*s.pending_score, slot, &all_sc, at, rows);
      });
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

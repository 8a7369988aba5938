#include "model/sequence_state.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/model.h"

namespace dsmesh {
namespace {

size_t Bytes(const Tensor& t) { return t.data ? t.nbytes() : 0; }

Tensor CloneTensor(Backend& be, const Tensor& t) {
  if (!t.data) return Tensor{};
  Tensor c = be.Alloc(t.dtype, t.shape);
  if (!t.shape.empty() && t.shape[0] > 0) be.CopyRows(t, 0, &c, 0, t.shape[0]);
  return c;
}

CompressorState CloneCompressor(Backend& be, const CompressorState& s) {
  CompressorState c = s;
  c.pending_kv = CloneTensor(be, s.pending_kv);
  c.pending_score = CloneTensor(be, s.pending_score);
  c.entries = CloneTensor(be, s.entries);
  return c;
}

void ReserveCompressor(SequenceStateData* d, CompressorState* cs, int64_t total_tokens) {
  if (cs->ratio > 0) d->EnsureEntries(cs, total_tokens / cs->ratio);
}

}  // namespace

void RingPut(Backend& be, const Tensor& src, int64_t src_row, int64_t pos, int64_t n, Tensor* ring) {
  const int64_t slots = ring->shape[0];
  if (n > slots) throw std::logic_error("RingPut: more rows than slots");
  const int64_t first = pos % slots, head = std::min(n, slots - first);
  if (head > 0) be.CopyRows(src, src_row, ring, first, head);
  if (n > head) be.CopyRows(src, src_row + head, ring, 0, n - head);
}

void RingGet(Backend& be, const Tensor& ring, int64_t pos, int64_t n, Tensor* dst, int64_t dst_row) {
  const int64_t slots = ring.shape[0];
  if (n > slots) throw std::logic_error("RingGet: more rows than slots");
  const int64_t first = pos % slots, head = std::min(n, slots - first);
  if (head > 0) be.CopyRows(ring, first, dst, dst_row, head);
  if (n > head) be.CopyRows(ring, 0, dst, dst_row + head, n - head);
}

void SequenceStateData::EnsureEntries(CompressorState* cs, int64_t entries) {
  int64_t cap = cs->entries.data ? cs->entries.shape[0] : 0;
  if (entries <= cap) return;
  int64_t new_cap = std::max<int64_t>({entries, cap * 2, 16});
  Tensor grown = backend->Alloc(DType::kF32, {new_cap, cs->dim});
  if (cs->num_entries > 0) backend->CopyRows(cs->entries, 0, &grown, 0, cs->num_entries);
  cs->entries = grown;
}

SequenceState::SequenceState(std::unique_ptr<SequenceStateData> data) : data_(std::move(data)) {}
SequenceState::~SequenceState() = default;

int64_t SequenceState::length() const { return data_->length; }
int SequenceState::speculative_tokens() const { return data_->spare; }

std::unique_ptr<SequenceState> SequenceState::Clone() const {
  auto d = std::make_unique<SequenceStateData>();
  Backend& be = *data_->backend;
  d->backend = data_->backend;
  d->owner_model = data_->owner_model;
  d->length = data_->length;
  d->spare = data_->spare;
  for (const LayerState& l : data_->layers) {
    LayerState c;
    c.ring = CloneTensor(be, l.ring);
    c.compressor = CloneCompressor(be, l.compressor);
    c.indexer = CloneCompressor(be, l.indexer);
    d->layers.push_back(std::move(c));
  }
  d->mtp.length = data_->mtp.length;
  d->mtp.hidden = CloneTensor(be, data_->mtp.hidden);
  d->mtp.tokens = data_->mtp.tokens;
  return std::make_unique<SequenceState>(std::move(d));
}

void SequenceState::Rollback(int64_t length) {
  SequenceStateData& d = *data_;
  if (length < 0 || length > d.length)
    throw std::runtime_error("Rollback: length " + std::to_string(length) + " outside [0, " +
                             std::to_string(d.length) + "]");
  if (d.length - length > d.spare)
    throw std::runtime_error("Rollback: " + std::to_string(d.length - length) + " positions to forget, the state keeps " +
                             std::to_string(d.spare) + " spare rows");
  d.length = length;
  for (LayerState& l : d.layers)
    for (CompressorState* c : {&l.compressor, &l.indexer})
      if (c->ratio > 0) c->num_entries = std::min(c->num_entries, length / c->ratio);
  d.mtp.length = std::min(d.mtp.length, length);
}

size_t SequenceState::MemoryBytes() const {
  size_t total = 0;
  for (const LayerState& l : data_->layers) {
    total += Bytes(l.ring);
    for (const CompressorState* c : {&l.compressor, &l.indexer})
      total += Bytes(c->pending_kv) + Bytes(c->pending_score) + Bytes(c->entries);
  }
  total += Bytes(data_->mtp.hidden) + data_->mtp.tokens.size() * sizeof(int32_t);
  return total;
}

void SequenceState::Reserve(int64_t total_tokens) {
  for (LayerState& l : data_->layers) {
    ReserveCompressor(data_.get(), &l.compressor, total_tokens);
    ReserveCompressor(data_.get(), &l.indexer, total_tokens);
  }
}

}  // namespace dsmesh

#include "model/sequence_state.h"

#include <algorithm>

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

std::unique_ptr<SequenceState> SequenceState::Clone() const {
  auto d = std::make_unique<SequenceStateData>();
  Backend& be = *data_->backend;
  d->backend = data_->backend;
  d->owner_model = data_->owner_model;
  d->length = data_->length;
  for (const LayerState& l : data_->layers) {
    LayerState c;
    c.ring = CloneTensor(be, l.ring);
    c.compressor = CloneCompressor(be, l.compressor);
    c.indexer = CloneCompressor(be, l.indexer);
    d->layers.push_back(std::move(c));
  }
  return std::make_unique<SequenceState>(std::move(d));
}

size_t SequenceState::MemoryBytes() const {
  size_t total = 0;
  for (const LayerState& l : data_->layers) {
    total += Bytes(l.ring);
    for (const CompressorState* c : {&l.compressor, &l.indexer})
      total += Bytes(c->pending_kv) + Bytes(c->pending_score) + Bytes(c->entries);
  }
  return total;
}

void SequenceState::Reserve(int64_t total_tokens) {
  for (LayerState& l : data_->layers) {
    ReserveCompressor(data_.get(), &l.compressor, total_tokens);
    ReserveCompressor(data_.get(), &l.indexer, total_tokens);
  }
}

}  // namespace dsmesh

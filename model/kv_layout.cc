#include "model/kv_layout.h"

#include <cstdio>
#include <stdexcept>

namespace dsmesh {

KvCacheDtype ParseKvCacheDtype(const std::string& value) {
  if (value == "bf16" || value == "bfloat16") return KvCacheDtype::kBf16;
  if (value == "fp8" || value == "fp8_e4m3") return KvCacheDtype::kFp8;
  if (value == "auto" || value == "f32" || value == "float32") return KvCacheDtype::kF32;
  throw std::invalid_argument("--kv-cache-dtype " + value + ": expected auto, bf16, fp8 or fp8_e4m3");
}

const char* KvCacheDtypeName(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kF32: return "f32";
    case KvCacheDtype::kBf16: return "bf16";
    case KvCacheDtype::kFp8: return "fp8_e4m3";
  }
  return "?";
}

namespace {

int64_t EntryBytes(KvCacheDtype d, int64_t dim, int64_t rope_dim) {
  switch (d) {
    case KvCacheDtype::kF32: return 4 * dim;
    case KvCacheDtype::kBf16: return 2 * dim;
    case KvCacheDtype::kFp8: return (dim - rope_dim) + 4 + 2 * rope_dim;
  }
  return 0;
}

// One compressor's open window: kv and score rows of (overlap ? 2 : 1) x ratio positions (+ spare
// rows), each (overlap ? 2 : 1) x dim wide, f32.
int64_t PartialBytes(int ratio, bool overlap, int64_t dim, int spare) {
  const int64_t c = overlap ? 2 : 1;
  return 2 * 4 * (c * ratio + spare) * (c * dim);
}

}  // namespace

KvLayout ComputeKvLayout(const ModelConfig& c, KvCacheDtype dtype, bool with_mtp, int spare) {
  KvLayout k;
  k.dtype = dtype;
  k.entry_bytes = EntryBytes(dtype, c.head_dim, c.rope_dim);
  k.window_row_bytes = k.entry_bytes;
  k.indexer_key_bytes = EntryBytes(dtype, c.index_head_dim, 0);
  KvLayerKind sliding{"sliding"}, csa{"csa"}, hca{"hca"}, mtp{"mtp"};
  const int64_t ring = static_cast<int64_t>(c.sliding_window + spare) * k.window_row_bytes;
  for (int l = 0; l < c.num_layers; ++l) {
    const int r = c.compress_ratio(l);
    switch (c.attention_kind(l)) {
      case AttentionKind::kSliding:
        ++sliding.layers;
        sliding.window_bytes += ring;
        break;
      case AttentionKind::kCompressedSparse:
        ++csa.layers;
        csa.ratio = r;
        csa.window_bytes += ring;
        csa.bytes_per_token += static_cast<double>(k.entry_bytes + k.indexer_key_bytes) / r;
        csa.partial_bytes += PartialBytes(r, true, c.head_dim, spare) + PartialBytes(r, true, c.index_head_dim, spare);
        break;
      case AttentionKind::kHeavilyCompressed:
        ++hca.layers;
        hca.ratio = r;
        hca.window_bytes += ring;
        hca.bytes_per_token += static_cast<double>(k.entry_bytes) / r;
        hca.partial_bytes += PartialBytes(r, false, c.head_dim, spare);
        break;
    }
  }
  if (with_mtp && c.num_mtp_layers > 0) {
    const int n = c.num_mtp_layers;
    mtp.layers = n;
    mtp.window_bytes = ring * n;
    // The target rows (+ token) reach back one window per MTP block; blocks 1.. keep their inputs too
    // (model/state_pool.cc).
    const int64_t row = 4LL * c.hc_mult * c.hidden_size;
    // A vision model keeps per history row also its image embedding (f32) and an image flag (one byte).
    const int64_t image = c.vision.enabled() ? 4LL * c.hidden_size + 1 : 0;
    if (spare > 0)
      mtp.history_bytes = (row + 4 + image) * (static_cast<int64_t>(n) * c.sliding_window + spare) +
                          row * (n - 1) * (c.sliding_window + spare);
  }
  for (KvLayerKind* kind : {&sliding, &csa, &hca, &mtp})
    if (kind->layers > 0) k.kinds.push_back(*kind);
  return k;
}

double KvLayout::BytesPerToken() const {
  double b = 0;
  for (const KvLayerKind& k : kinds) b += k.bytes_per_token;
  return b;
}

int64_t KvLayout::FixedBytesPerSequence() const {
  int64_t b = 0;
  for (const KvLayerKind& k : kinds) b += k.window_bytes + k.partial_bytes + k.history_bytes;
  return b;
}

double KvLayout::SequenceBytes(int64_t tokens) const {
  double b = static_cast<double>(FixedBytesPerSequence());
  for (const KvLayerKind& k : kinds)
    if (k.ratio > 0) b += k.bytes_per_token * k.ratio * static_cast<double>(tokens / k.ratio);
  return b;
}

std::string KvLayout::Describe(int64_t context) const {
  std::string s;
  char line[256];
  std::snprintf(line, sizeof(line), "KV layout %s: entry %lld B, indexer key %lld B, window row %lld B, block %d tokens\n",
                KvCacheDtypeName(dtype), (long long)entry_bytes, (long long)indexer_key_bytes,
                (long long)window_row_bytes, block_tokens);
  s += line;
  for (const KvLayerKind& k : kinds) {
    std::snprintf(line, sizeof(line), "  %-7s %2d layers  ratio %3d  %8.1f B/token  windows %8.2f MiB  partial %7.2f MiB\n",
                  k.name.c_str(), k.layers, k.ratio, k.bytes_per_token, k.window_bytes / 1048576.0,
                  k.partial_bytes / 1048576.0);
    s += line;
  }
  std::snprintf(line, sizeof(line), "  total %.1f B/token, %.2f MiB fixed per sequence, %.3f GiB per sequence at %lld tokens\n",
                BytesPerToken(), FixedBytesPerSequence() / 1048576.0, SequenceBytes(context) / 1073741824.0,
                (long long)context);
  s += line;
  return s;
}

}  // namespace dsmesh

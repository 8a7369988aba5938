#include "kernels/op_bytes.h"

#include <algorithm>
#include <vector>

namespace dsmesh::op_bytes {

double Exl3Weight(int64_t k, int64_t n, int K) {
  return static_cast<double>(k) * n * K / 8.0 + 2.0 * k + 2.0 * n;
}

double DenseWeight(int64_t count, int64_t element_bytes) { return static_cast<double>(count) * element_bytes; }

double LinearActivations(int64_t m, int64_t in, int64_t out, bool bias) {
  return kF32 * (static_cast<double>(m) * in + static_cast<double>(m) * out + (bias ? out : 0));
}

double RmsNorm(int64_t numel, int64_t dim, bool weight) { return kF32 * (2.0 * numel + (weight ? dim : 0)); }

double Add(int64_t numel) { return kF32 * 3.0 * numel; }

double Scale(int64_t numel) { return kF32 * 2.0 * numel; }

double Rope(int64_t n, int64_t heads, int64_t rope_dim) { return kF32 * 2.0 * n * heads * rope_dim + 8.0 * n; }

double Embedding(int64_t n, int64_t D, int64_t table_element_bytes) {
  return 4.0 * n + static_cast<double>(n) * D * table_element_bytes + kF32 * n * D;
}

double HcPre(int64_t n, int64_t D, int hc) {
  const double X = static_cast<double>(n) * hc * D, fn = static_cast<double>(2 + hc) * hc * hc * D;
  return kF32 * (X + fn + static_cast<double>(n) * D + static_cast<double>(n) * hc + static_cast<double>(n) * hc * hc);
}

double HcPost(int64_t n, int64_t D, int hc) {
  const double X = static_cast<double>(n) * hc * D;
  return kF32 * (X + static_cast<double>(n) * D + static_cast<double>(n) * hc + static_cast<double>(n) * hc * hc + X);
}

double HcExpand(int64_t n, int64_t D, int hc) { return kF32 * (static_cast<double>(n) * D + static_cast<double>(n) * hc * D); }

double HcHead(int64_t n, int64_t D, int hc) {
  return kF32 * (static_cast<double>(n) * hc * D + static_cast<double>(hc) * hc * D + static_cast<double>(n) * D);
}

double MoeRoute(int64_t n, int64_t E, int top_k, bool bias) {
  return kF32 * (static_cast<double>(n) * E + (bias ? E : 0)) + 8.0 * n * top_k;
}

double MoeExpertsActivations(int64_t m, int64_t D, int top_k) {
  return kF32 * (static_cast<double>(m) * D + 2.0 * m * D) + 8.0 * m * top_k;
}

double SwiGlu(int64_t numel) { return kF32 * 3.0 * numel; }

double Attention(int64_t n, int64_t heads, int64_t d, int64_t kv_rows, int64_t kv_row_bytes) {
  return kF32 * (2.0 * n * heads * d + heads) + static_cast<double>(kv_rows) * kv_row_bytes;
}

double IndexerTopK(int64_t n, int64_t heads, int64_t dim, int64_t keys, int64_t key_row_bytes, int top_k) {
  return kF32 * (static_cast<double>(n) * heads * dim + static_cast<double>(n) * heads) +
         static_cast<double>(keys) * key_row_bytes + 4.0 * n * top_k;
}

double Copy(int64_t bytes) { return 2.0 * bytes; }

double DistinctIdBytes(const int32_t* ids, int64_t n, double bytes_each) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] >= 0) v.push_back(ids[i]);
  std::sort(v.begin(), v.end());
  return bytes_each * static_cast<double>(std::unique(v.begin(), v.end()) - v.begin());
}

}  // namespace dsmesh::op_bytes

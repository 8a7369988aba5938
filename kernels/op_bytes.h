// The bytes a backend op must move: what `dsmesh bench --profile` divides by an op's device time for its
// achieved GB/s. An op counts its inputs read once and its outputs written once, weights as the backend
// holds them (an EXL3 linear's trellis, suh and svh; a dense weight's elements), and no temporaries of
// its own launches; an op composed of other backend ops adds what those count. KV rows count as the
// rows the op reads (the window, the selected or all compressed entries, every indexer key). The CUDA
// backend's op dispatch calls these with each call's shapes (kernels/cuda/cuda_backend.cc).
#pragma once

#include <cstdint>

namespace dsmesh::op_bytes {

constexpr double kF32 = 4;

// An EXL3 linear held as a k x n block range of K bits: trellis k n K / 8, fp16 suh [k] and svh [n].
double Exl3Weight(int64_t k, int64_t n, int K);
// A dense weight of `count` elements of `element_bytes` each.
double DenseWeight(int64_t count, int64_t element_bytes);
// A linear's activations: x [m, in] read, out [m, out] written (f32), and an f32 bias [out] when present.
double LinearActivations(int64_t m, int64_t in, int64_t out, bool bias);
// x [numel] read, out written, an f32 weight [dim] when present.
double RmsNorm(int64_t numel, int64_t dim, bool weight);
// a read, acc read and written.
double Add(int64_t numel);
// x read and written.
double Scale(int64_t numel);
// The rotated part of n rows of heads x rope_dim read and written, and the rows' positions (int64).
double Rope(int64_t n, int64_t heads, int64_t rope_dim);
// n token ids (int32) and n table rows of D elements of `table_element_bytes` read, out [n, D] written.
double Embedding(int64_t n, int64_t D, int64_t table_element_bytes);
// Hyper-connections over hc streams of width D, n rows:
//   HcPre: X [n, hc D] and fn [(2 + hc) hc, hc D] read, y [n, D], post [n, hc] and comb [n, hc, hc] written;
//   HcPost: X [n, hc D], f [n, D], post and comb read, out [n, hc D] written;
//   HcExpand: h [n, D] read, X [n, hc D] written; HcHead: X and fn [hc, hc D] read, y [n, D] written.
double HcPre(int64_t n, int64_t D, int hc);
double HcPost(int64_t n, int64_t D, int hc);
double HcExpand(int64_t n, int64_t D, int hc);
double HcHead(int64_t n, int64_t D, int hc);
// Router logits [n, E] and bias [E] read, top_k ids (int32) and weights (f32) per row written.
double MoeRoute(int64_t n, int64_t E, int top_k, bool bias);
// The routed experts' activations: x [m, D] read, the ids and weights [m, top_k] read, out read and written.
double MoeExpertsActivations(int64_t m, int64_t D, int top_k);
// g and u [numel] read, g written.
double SwiGlu(int64_t numel);
// q and out [n, heads d] (f32), sinks [heads], and `kv_rows` rows of `kv_row_bytes` each.
double Attention(int64_t n, int64_t heads, int64_t d, int64_t kv_rows, int64_t kv_row_bytes);
// q [n, heads dim] and weights [n, heads] read, `keys` keys of `key_row_bytes` read, out [n, top_k] (int32).
double IndexerTopK(int64_t n, int64_t heads, int64_t dim, int64_t keys, int64_t key_row_bytes, int top_k);
// A copy of `bytes`: read once, written once.
double Copy(int64_t bytes);
// The distinct non-negative ids among ids[0, n) times bytes_each: the routed experts one launch must
// read when a step's rows chose `ids`.
double DistinctIdBytes(const int32_t* ids, int64_t n, double bytes_each);

}  // namespace dsmesh::op_bytes

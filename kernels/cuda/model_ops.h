// CUDA kernels of the DeepSeek-V4 forward's small ops: one launcher per op of the Backend seam
// (kernels/backend.h), each the device twin of the CPU op of the same name in kernels/cpu/cpu_backend.cc
// and tested against it (kernels/cuda/cuda_backend_test.cc). All pointers are device pointers, all
// activations f32 row-major; every launcher enqueues on `stream`, allocates nothing and never
// synchronizes, so it can run inside a CUDA graph capture. The heavy linears (EXL3) live in exl3_*.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace dsmesh::cuda_ops {

// Where a launch's parameter block goes. Launchers that take a ParamStager hand it their per-step
// parameters (each sequence's position, ring, block table) and the kernels read them from the device
// address it returns; the CUDA backend stages them beside the step's others, so that a recorded graph
// replays the same launches with each step's parameters (Backend::StatefulSegment).
class ParamStager {
 public:
  virtual ~ParamStager() = default;
  // A device copy of `bytes` bytes at `host`, readable by launches enqueued after this call.
  virtual const void* Stage(const void* host, size_t bytes) = 0;
  // False while the caller only collects parameters (a recorded graph makes the launches): the
  // launchers stage everything and then return without launching.
  virtual bool Launching() const { return true; }
  template <class T>
  const T* Stage(const T& params) {
    return static_cast<const T*>(Stage(&params, sizeof(T)));
  }
};

// How a paged pool stores its rows (kernels/kv_rows.h, --kv-cache-dtype): f32, bf16, or the fp8 layout
// (dim - rope_dim e4m3 bytes, the row's f32 scale, rope_dim bf16 values).
enum class RowKind : int32_t { kF32 = 0, kBF16 = 1, kFp8 = 2 };

// Rows of a paged pool (Backend's PagedRows on the device): row e is row
// table[e / rows_per_block] * rows_per_block + e % rows_per_block of pool, row_bytes bytes each.
struct PagedRowsDev {
  const void* pool = nullptr;
  int32_t rows_per_block = 1;
  // log2(rows_per_block) when it is a power of two (every state pool's block is), else -1: the key
  // loops call Row() once per key, and a shift and mask cost far less than an integer division.
  int32_t block_shift = 0;
  const int32_t* table = nullptr;
  int64_t row_bytes = 0;
  RowKind kind = RowKind::kF32;
  int32_t nope = 0;  // fp8 rows: the e4m3 values before the scale (dim - rope_dim)
#ifdef __CUDACC__
  __device__ const void* Row(int64_t e) const {
    const int32_t i = static_cast<int32_t>(e);  // entries of one sequence: far below 2^31
    const int32_t block = block_shift >= 0 ? i >> block_shift : i / rows_per_block;
    const int32_t row = block_shift >= 0 ? i & (rows_per_block - 1) : i - block * rows_per_block;
    return static_cast<const uint8_t*>(pool) + (static_cast<int64_t>(table[block]) * rows_per_block + row) * row_bytes;
  }
#endif
};

// src [rows, dim] f32 -> `rows` rows of the storage `kind` at dst, row_bytes apart (the caller's
// KvRowBytes), bit for bit what kernels/kv_rows.h's EncodeKvRows writes.
void EncodeKvRows(const float* src, int64_t rows, int64_t dim, int64_t rope_dim, RowKind kind, int64_t row_bytes,
                  void* dst, cudaStream_t s);

// Keeps the stream busy for about `ns` nanoseconds (one thread reading the global timer): the op
// profiler's device-only mode puts it before an op so that the op's launches are all queued when it starts.
void Spin(int64_t ns, cudaStream_t s);

// Weight/table element types the dense kernels read (the order of the template instantiations).
enum class WType { kF32, kBF16, kF16 };

// out[i] = float(w[i]) for i < count (bf16/fp16/fp32 weights).
void WidenToF32(const void* w, WType type, int64_t count, float* out, cudaStream_t s);

// ---- elementwise and normalisation ----
void Embedding(const void* table, WType type, int64_t dim, const int32_t* tokens, int64_t n, float* out,
               cudaStream_t s);
// groups rows of `dim` values; weight may be null.
void RmsNorm(const float* x, int64_t groups, int64_t dim, const float* weight, float eps, float* out, cudaStream_t s);
void Add(const float* a, int64_t n, float* acc, cudaStream_t s);
void Scale(float* x, int64_t n, float v, cudaStream_t s);
// Interleaved rope on the last rope_dim values of each head; positions int64 [n], inv_freq [rope_dim/2].
void Rope(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
          const float* inv_freq, bool inverse, cudaStream_t s);
// f32 [rows, cols] -> fp16 [rows, ld_out] at column offset col0 (other columns zero).
void ToHalfPadded(const float* x, int64_t rows, int64_t cols, int64_t ld_in, uint16_t* out, int64_t ld_out,
                  int64_t col0, cudaStream_t s);
// A grouped linear's rows regrouped: xh[g][r][:] = fp16(x[r][g * in ..]) (each group's m rows contiguous),
// and back: out[r][g * cols ..] = yg[g][r][:].
void GroupMajorToHalf(const float* x, int64_t m, int64_t groups, int64_t in, uint16_t* xh, cudaStream_t s);
void RowMajorFromGroups(const float* yg, int64_t m, int64_t groups, int64_t cols, float* out, cudaStream_t s);
// out[r, c] (= or +=) y[r, col0 + c] + bias[c] for c < cols; y row stride ld_y, out row stride ld_out.
void TakeColumns(const float* y, int64_t rows, int64_t ld_y, int64_t col0, int64_t cols, const float* bias,
                 float* out, int64_t ld_out, bool accumulate, cudaStream_t s);
// dst[i, :] = src[rows[i], :]   (width floats per row)
void GatherRows(const float* src, const int32_t* rows, int64_t n, int64_t width, float* dst, cudaStream_t s);
// dst[rows[i], :] += w[i] * src[i, :]  (rows of one call are distinct)
void ScatterAddRows(const float* src, const int32_t* rows, const float* w, int64_t n, int64_t width, float* dst,
                    cudaStream_t s);
// ---- routed experts of a prefill chunk as pairs sorted by expert (model_ops_moe.cu) ----
// The P = n * k (row, slot) pairs of ids/weights [n, k], stably grouped by expert id: sorted_ids,
// sorted_w, src_row [P] (ids outside [0, num_experts) last, as -1), pos [P] the sorted place of pair
// r * k + j. P <= kMoeSortMaxPairs, num_experts <= kMoeSortMaxExperts.
constexpr int kMoeSortMaxExperts = 256;
constexpr int kMoeSortMaxPairs = 32768;
void SortPairsByExpert(const int32_t* ids, const float* weights, int64_t n, int k, int num_experts,
                       int32_t* sorted_ids, float* sorted_w, int32_t* src_row, int32_t* pos, cudaStream_t s);
// xh[p, :] = fp16(x[src_row[p], :]) for p < P (width % 4 == 0).
void GatherRowsToHalf(const float* x, int64_t width, const int32_t* src_row, int64_t P, uint16_t* xh, cudaStream_t s);
// out[r, :] += y[pos[r k], :] + ... + y[pos[r k + k - 1], :], the slots summed in order, skipping pairs
// whose sorted id is -1 (width % 4 == 0).
void AddPairsToRows(const float* y, const int32_t* pos, const int32_t* sorted_ids, int64_t n, int k, int64_t width,
                    float* out, cudaStream_t s);
// g = silu(min(g, limit)) * clamp(u, -limit, limit) (no clamp for limit <= 0), in place in g.
void SwiGlu(float* g, const float* u, int64_t n, float limit, cudaStream_t s);
// gh = fp16(SwiGlu's value of g, u) (ToHalfPadded's rounding): the fp16 input of an EXL3 down projection.
void SwiGluToHalf(const float* g, const float* u, int64_t n, float limit, uint16_t* gh, cudaStream_t s);
// dst rows [dst_row, +rows) = src rows [src_row, +rows), row_bytes each (overlapping ranges allowed).
// Up to CopyBytesBatchMax() copies of bytes[i] bytes from src[i] to dst[i], in one launch.
struct ByteCopy {
  const void* src;
  void* dst;
  int64_t bytes;
};
int CopyBytesBatchMax();
void CopyBytesBatch(const ByteCopy* copies, int n, cudaStream_t s);
void CopyRows(const void* src, int64_t src_row, void* dst, int64_t dst_row, int64_t rows, int64_t row_bytes,
              cudaStream_t s);

// ---- hyper-connections ----
// HcPre: one launch (a cluster of 8 blocks per role and group of rows; sm_90+), no scratch; at most 65535
// rows per call. With y_norm, y is then RmsNorm'ed in place in the same launch (weight y_norm->weight, null
// for none, eps y_norm->eps). HcHead's mixes: scratch of n * hc floats.
struct HcYNorm {
  const float* weight;
  float eps;
};
void HcPre(const float* X, int64_t n, int64_t D, int hc, const float* fn, const float* base, const float* scale,
           int iters, float eps, float norm_eps, float* y, float* post, float* comb, cudaStream_t s,
           const HcYNorm* y_norm = nullptr);
void HcExpand(const float* h, int64_t n, int64_t D, int hc, float* X, cudaStream_t s);
void HcPost(const float* X, const float* f, const float* post, const float* comb, int64_t n, int64_t D, int hc,
            float* out, cudaStream_t s);
void HcHead(const float* X, int64_t n, int64_t D, int hc, const float* fn, const float* base, const float* scale,
            float eps, float norm_eps, float* mixes, float* y, cudaStream_t s);

// ---- dense linear: out[m, n] = x[m, k] W^T (+ bias), W [n, k] row-major with row stride ldw ----
void DenseLinear(const float* x, int64_t ldx, int64_t m, const void* w, WType type, int64_t ldw, int64_t n,
                 int64_t k, const float* bias, float* out, int64_t ldo, cudaStream_t s);

// ---- compressor ----
// positions: n device values (the rows' positions).
void AddPositionBias(float* score, int64_t n, int64_t width, const float* ape, const int64_t* positions, int ratio,
                     cudaStream_t s);
void CompressorPool(const float* kv, const float* score, int64_t width, int64_t base_pos, int64_t first_window,
                    int64_t num_windows, int ratio, bool overlap, int64_t d, float* out, cudaStream_t s);

// ---- stateful writes (model_ops_state.cu) ----
// Backend::CompressorStep for up to CompressorStepMaxSeqs() sequences. Each window a sequence completes is
// pooled, normed, roped and stored (CompressorPool, RmsNorm, Rope and EncodeKvRows in one), then the rings
// take the step's rows. Steps whose sequences complete at most a few windows each (decode, verification)
// are one launch, one block per sequence that does both in turn; longer ones (prefill chunks) one block per
// (sequence, window it may complete), then the rings in a second launch (RingWriteBatch). The launches'
// shapes depend on the sequences' row counts only. Entry width at most CompressorStepMaxDim(), windows of
// at most CompressorStepMaxWindowRows() rows ((overlap ? 2 : 1) * ratio).
struct CompressorSeqDev {
  int64_t offset = 0, count = 0, start = 0, num_entries = 0;
  float* ring_kv = nullptr;
  float* ring_score = nullptr;
  int64_t ring_slots = 0;
  PagedRowsDev entries;  // written
};
struct CompressorStepArgs {
  const float* kv = nullptr;     // [rows, width], width = (overlap ? 2 : 1) * dim
  const float* score = nullptr;  // the same
  const float* ape = nullptr;    // [ratio, width]: added to score row by position % ratio (null: added already)
  int ratio = 0;
  bool overlap = false;
  int64_t dim = 0, rope_dim = 0;
  const float* norm = nullptr;   // [dim]
  float eps = 0.0f;
  const float* inv_freq = nullptr;  // [rope_dim / 2]
};
int CompressorStepMaxSeqs();
int64_t CompressorStepMaxDim();
int CompressorStepMaxWindowRows();
void CompressorStep(const CompressorStepArgs& args, const CompressorSeqDev* seqs, int num_seqs, ParamStager& stage,
                    cudaStream_t s);
// Backend::RingWriteBatch on f32 rings: rows src_row .. + n - 1 of src to slots (pos + i) % slots of ring,
// `width` floats per row, each plus row (pos + i) % add_period of `add` where given (the compressor's
// position bias); the launch's shape depends on the number of writes and the largest n.
struct RingWriteDev {
  const float* src = nullptr;
  int64_t src_row = 0, pos = 0, n = 0;
  float* ring = nullptr;
  int64_t slots = 0, width = 0;
  const float* add = nullptr;
  int64_t add_period = 1;
};
void RingWriteBatch(const RingWriteDev* writes, int num_writes, ParamStager& stage, cudaStream_t s);

// ---- lightning indexer ----
// Scratch floats IndexerTopK needs for n rows when the launch covers ld_keys keys per row (at least every
// sequence's num_keys; the launch's shape depends on n and ld_keys only).
int64_t IndexerScratchFloats(int64_t n, int64_t ld_keys);
void IndexerTopK(const float* q, const float* weights, PagedRowsDev keys, int64_t num_keys, int64_t heads,
                 int64_t dim, const int64_t* positions, int64_t n, int ratio, int top_k, int64_t ld_keys,
                 float* scratch, int32_t* out, ParamStager& stage, cudaStream_t s);

// Several sequences of one step in one launch (Backend::IndexerTopKBatch): sequence i owns rows
// offset .. offset + count - 1 of q, weights, positions and out; scratch of IndexerScratchFloats(n, the
// largest num_keys) floats; at most IndexerBatchMaxRows() rows of IndexerBatchMaxSeqs() sequences.
struct IndexerSeqDev {
  int64_t offset = 0, count = 0;
  PagedRowsDev keys;
  int64_t num_keys = 0;
};
int IndexerBatchMaxRows();
int IndexerBatchMaxSeqs();
void IndexerTopKBatch(const float* q, const float* weights, const IndexerSeqDev* seqs, int num_seqs, int64_t heads,
                      int64_t dim, const int64_t* positions, int64_t n, int ratio, int top_k, int64_t ld_keys,
                      float* scratch, int32_t* out, ParamStager& stage, cudaStream_t s);

// ---- attention (one sequence; see Backend::Attention) ----
// Largest number of keys one query row may see (shared memory of the kernel).
int64_t AttentionMaxKeys();
// The ring holds ring_slots >= window rows (slot = position % ring_slots).
// With `split_scratch` (AttentionSplitScratchFloats floats) each row's keys are split over many blocks,
// 16 rows per launch (decode and verification in one, prefill chunks in slices); with a null scratch one
// block per (row, head) takes them all.
int64_t AttentionSplitScratchFloats(int64_t n, int64_t heads, int64_t d);
void Attention(const float* q, int64_t n, int64_t heads, int64_t d, int64_t start, const float* ring,
               int64_t ring_slots, const float* new_kv, int window, PagedRowsDev entries, int64_t num_entries, int ratio,
               const int32_t* topk, int64_t topk_cols, const float* sinks, float softmax_scale, float* out,
               float* split_scratch, ParamStager& stage, cudaStream_t s);
// Attention on tensor cores for prefill chunks (model_ops_attention_prefill.cu): Attention's arguments and
// result. q, keys and probabilities go to the mma as fp16 high + low parts (three mma per product; within
// f32 rounding of the CPU op), or with `fp16` as one fp16 rounding (one mma; ~4e-4 relative L2 from the
// f32 op at unit-variance inputs). head_dim 64, 128, 256 or 512, where the device has the shared memory
// for it (AttentionPrefillSupported; head_dim 512 needs ~150 KB (fp16) or ~205 KB per block: sm_90 has
// it, sm_120 does not).
bool AttentionPrefillSupported(int64_t d, bool fp16);
void AttentionPrefill(const float* q, int64_t n, int64_t heads, int64_t d, int64_t start, const float* ring,
                      int64_t ring_slots, const float* new_kv, int window, PagedRowsDev entries, int64_t num_entries,
                      int ratio, const int32_t* topk, int64_t topk_cols, const float* sinks, float softmax_scale,
                      bool fp16, float* out, cudaStream_t s);
// Several sequences of one step in one launch (Backend::AttentionBatch): sequence i owns rows
// offset .. offset + count - 1 of q, new_kv, topk and out. Steps of at most AttentionBatchMaxRows() rows
// and AttentionBatchMaxSeqs() sequences, with split_scratch of AttentionSplitScratchFloats(n, ...).
struct AttentionSeqDev {
  int64_t offset = 0, count = 0, start = 0;
  int64_t first_row = 0;  // the sequence's row that row `offset` of the launch is (slices of a long step)
  const float* ring = nullptr;
  int64_t ring_slots = 0;
  PagedRowsDev entries;  // pool null: no compressed entries
  int64_t num_entries = 0;
};
int AttentionBatchMaxRows();
int AttentionBatchMaxSeqs();
void AttentionBatch(const float* q, int64_t n, int64_t heads, int64_t d, const float* new_kv, int window, int ratio,
                    const int32_t* topk, int64_t topk_cols, const AttentionSeqDev* seqs, int num_seqs,
                    const float* sinks, float softmax_scale, float* out, float* split_scratch, ParamStager& stage,
                    cudaStream_t s);
void UpdateRing(const float* new_kv, int64_t n, int64_t d, int64_t start, int64_t ring_slots, float* ring,
                cudaStream_t s);

// ---- MoE router ----
// tid2eid int32 [vocab, k] for hash layers (tokens then required), else bias f32 [E] (may be null).
void MoeRoute(const float* logits, int64_t n, int64_t E, const int32_t* tokens, const int32_t* tid2eid,
              const float* bias, int k, bool normalize, float routed_scale, int32_t* idx, float* weight,
              cudaStream_t s);

// ---- image steps and the vision tower (model_ops_vision.cu; CPU twins: CpuBackend::SpanWindowAttention and
// kernels/cpu/vision_ops.cc) ----
// Attention as Attention's, except that query row r sees window positions visible_from[r] .. visible_to[r]
// (device int64 [n], absolute positions; Backend::SpanWindowAttention says which bounds are valid) instead
// of its causal window. head_dim <= SpanWindowAttentionMaxHeadDim().
int64_t SpanWindowAttentionMaxHeadDim();
void SpanWindowAttention(const float* q, int64_t n, int64_t heads, int64_t d, int64_t start, const float* ring,
                         int64_t ring_slots, const float* new_kv, const int64_t* visible_from,
                         const int64_t* visible_to, PagedRowsDev entries, int64_t num_entries, int ratio,
                         const int32_t* topk, int64_t topk_cols, const float* sinks, float softmax_scale, float* out,
                         cudaStream_t s);
// Bidirectional attention inside spans (Backend::SpanAttention), no sink. The launch runs over tiles of
// query rows of one span: SpanAttentionTiles (host) lays them out from the host span offsets (num_spans + 1
// values), four int32 per tile; `tiles` is their device copy. head_dim <= SpanAttentionMaxHeadDim().
int64_t SpanAttentionMaxHeadDim();
std::vector<int32_t> SpanAttentionTiles(const int64_t* spans, int64_t num_spans);
void SpanAttention(const float* q, const float* k, const float* v, int64_t heads, int64_t d, const int32_t* tiles,
                   int64_t num_tiles, float softmax_scale, float* out, cudaStream_t s);
// x [n, heads * head_dim]: (x[i], x[i + head_dim/2]) of every head rotated by angles[r * head_dim/2 + i].
void RotateHalf(float* x, int64_t n, int64_t heads, int64_t head_dim, const float* angles, cudaStream_t s);
// Exact GELU in place: x * (1 + erf(x / sqrt(2))) / 2.
void Gelu(float* x, int64_t n, cudaStream_t s);
// x [h*w, C] -> out [ceil(h/r) * ceil(w/r), C*r*r], feature c*r*r + dy*r + dx, zeros past the grid.
void Unfold2D(const float* x, int64_t h, int64_t w, int64_t C, int r, float* out, cudaStream_t s);

}  // namespace dsmesh::cuda_ops

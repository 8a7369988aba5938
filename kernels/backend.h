// The compute seam: every op the DeepSeek-V4 forward needs, on f32 activations held in backend memory.
// The forward (model/forward.cc) is written once against this interface; kernels/cpu/ implements it (the
// fp32 reference, also used in CI) and a CUDA backend implements it again on device memory.
//
// Conventions:
//   - Activations are row-major f32 Tensors allocated by the backend; "rows" are tokens. A row range of a
//     Tensor is a view (RowView below), so ops may receive sub-ranges of a bigger buffer.
//   - Weights are prepared once at load: Upload() moves a host tensor (an mmap view) into backend memory
//     (the CPU backend keeps the view: zero-copy). Linear weights may be dense (bf16/fp16/f32 [out, in]) or
//     EXL3 (an opaque handle built by the backend).
//   - Small per-token metadata (token ids, positions) is passed as host arrays; a device backend copies it.
//   - host_memory() says whether backend tensors are host memory; when not, collectives and host reads
//     stage through ToHost/FromHost.
//   - `out` may alias an input only where a comment says so.
//   - Step scope: the forward announces each step (BeginStep), takes its temporaries from Scratch, and
//     brackets runs of ops whose launches depend only on shapes in Segment(); a device backend uses these
//     to upload the step's metadata once, to avoid an allocation per op, and to record a segment once
//     (a CUDA graph) and replay it. The CPU backend runs everything directly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/tensor.h"
#include "kernels/graph_shape.h"           // StepGraphProfile
#include "kernels/sampling/row_sampler.h"  // RowSampling, SampledRow

namespace dsmesh {

class Checkpoint;

// y = x W^T (+ bias), W logically [out, in].
struct LinearWeight {
  std::string name;                 // tensor prefix, for error messages
  int64_t in = 0, out = 0;
  Tensor dense;                     // [out, in] bf16/fp16/f32 in backend memory, or empty when EXL3
  std::shared_ptr<void> exl3;       // backend-specific EXL3 weight, or null
  Tensor bias;                      // optional f32 [out]
  bool is_exl3() const { return exl3 != nullptr; }
};

// One SwiGLU expert (also the shared expert): out = w2 (silu(min(w1 x, limit)) * clamp(w3 x, -limit, limit)).
struct ExpertWeights {
  LinearWeight w1, w3, w2;  // gate [I, D], up [I, D], down [D, I]
};

// Router of one MoE layer.
struct RouterParams {
  int top_k = 0;
  bool normalize = true;         // w /= sum(w) (+1e-20)
  float routed_scale = 1.0f;
  bool hash = false;             // experts from tid2eid[token] instead of top-k(score + bias)
  const Tensor* bias = nullptr;  // f32 [E] e_score_correction_bias (non-hash layers)
  const Tensor* tid2eid = nullptr;  // int [vocab, top_k] (hash layers), host or backend memory
  // Image rows (DeepSeek-V4-Flash-Vision, docs/vision.md): host flags, one per row, or null for none. A
  // flagged row takes top_k(score + bias_vl) on every layer, hash layers included (bias_vl replaces the
  // tid2eid lookup there); its weights still come from the unbiased scores.
  const uint8_t* image_rows = nullptr;
  const Tensor* bias_vl = nullptr;  // f32 [E], required when image_rows is set
};

// Rows of one sequence's compressed entries or indexer keys in a paged pool: row e is row
// table[e / rows_per_block] * rows_per_block + e % rows_per_block of `pool` [blocks * rows_per_block, dim].
// `table` is a host array of table_len block ids (a device backend copies it).
// The pool's dtype is the rows' storage (kernels/kv_rows.h: F32, BF16, or U8 for the fp8 layout, whose
// last rope_dim values are bf16); backends that read only f32 rows refuse the others.
struct PagedRows {
  const Tensor* pool = nullptr;
  int64_t rows_per_block = 0;
  const int32_t* table = nullptr;
  int64_t table_len = 0;
  int64_t rope_dim = 0;
  int64_t capacity() const { return rows_per_block * table_len; }
};

// A plain [rows, dim] tensor as paged rows (one block).
inline PagedRows ContiguousRows(const Tensor& t) {
  static const int32_t kFirstBlock = 0;
  return PagedRows{&t, t.shape.empty() || t.shape[0] == 0 ? 1 : t.shape[0], &kFirstBlock, 1};
}

// The LinearWeight of an EXL3 slice [out_begin, out_end) x [in_begin, in_end) held by a backend's handle.
inline LinearWeight Exl3LinearWeight(const std::string& name, int64_t out_begin, int64_t out_end, int64_t in_begin,
                                     int64_t in_end, std::shared_ptr<void> handle) {
  LinearWeight lw;
  lw.name = name;
  lw.out = out_end - out_begin;
  lw.in = in_end - in_begin;
  lw.exl3 = std::move(handle);
  return lw;
}

// Device time of one kind of op, summed over its calls (Backend::TakeOpProfile), the host's time
// inside the op's call (argument checks, metadata, launches), and the bytes the calls must move
// (kernels/op_bytes.h; 0 where the backend counts none for the op).
struct OpTiming {
  std::string op;
  int64_t calls = 0;
  double ms = 0;
  double host_ms = 0;
  double bytes = 0;
};

// How a device backend times its ops (Backend::SetOpProfiling):
//   kTimeline: events around each op on the stream as it runs; the intervals tile the step's timeline,
//     so an op's time includes the host's launch gaps inside it (what the step costs, op by op);
//   kDeviceOnly: before each op the stream first waits on a short spin kernel, long enough for the host
//     to enqueue the whole op behind it, so each interval holds the op's device work alone.
enum class OpProfiling { kOff, kTimeline, kDeviceOnly };

// What the profiler saw since it was last asked: the ops (largest first) and the steps they ran in.
struct OpProfile {
  std::vector<OpTiming> ops;
  int64_t steps = 0;
  double step_ms = 0;      // the steps' device timelines, summed
  double between_ms = 0;   // of which no op's interval (the host's gaps between ops)
  // The device's memory bandwidth the ops' bytes are measured against, and where it came from.
  double peak_bytes_per_s = 0;
  std::string peak_source;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory ----
  virtual Tensor Alloc(DType dtype, std::vector<int64_t> shape) = 0;  // zero-filled
  virtual Tensor Upload(const Tensor& host) = 0;  // weights; CPU returns the same view
  virtual void ToHost(const Tensor& src, void* dst) = 0;  // src.nbytes() bytes
  virtual void FromHost(const void* src, Tensor* dst) = 0;  // dst->nbytes() bytes
  virtual bool host_memory() const { return true; }
  // Copies `rows` rows (row = product of shape[1:]) from src starting at src_row into dst at dst_row.
  virtual void CopyRows(const Tensor& src, int64_t src_row, Tensor* dst, int64_t dst_row, int64_t rows) = 0;
  virtual void Zero(Tensor* t) = 0;  // every byte of t = 0
  // Several CopyRows at once, in any order (no copy may write what another reads or writes). A device
  // backend may run them as one launch; the default runs CopyRows for each.
  struct RowCopy {
    const Tensor* src = nullptr;
    int64_t src_row = 0;
    Tensor* dst = nullptr;
    int64_t dst_row = 0, rows = 0;
  };
  virtual void CopyRowsBatch(const std::vector<RowCopy>& copies) {
    for (const RowCopy& c : copies) CopyRows(*c.src, c.src_row, c.dst, c.dst_row, c.rows);
  }

  // ---- step scope ----
  // Starts a forward step whose rows carry these token ids and positions, and whose sequences' block
  // tables (PagedRows::table) lie in `tables`. Later ops of the step may be passed pointers into these
  // same arrays (Embedding, Rope, MoeRoute, IndexerTopK, Attention); a device backend copies them once
  // here and recognises them. The arrays must stay unchanged until the next BeginStep. Scratch of the
  // previous step is released.
  struct StepMetadata {
    const int32_t* tokens = nullptr;
    const int64_t* positions = nullptr;
    int64_t n = 0;  // rows
    const int32_t* tables = nullptr;
    int64_t tables_len = 0;
  };
  virtual void BeginStep(const StepMetadata& step) {}
  virtual void EndStep() {}  // forgets the step's metadata and releases its Scratch
  // A temporary of this step, valid until ReleaseScratch of an earlier mark or the next BeginStep.
  // Contents undefined (the CPU backend zero-fills).
  virtual Tensor Scratch(DType dtype, std::vector<int64_t> shape) { return Alloc(dtype, std::move(shape)); }
  virtual size_t ScratchMark() { return 0; }
  virtual void ReleaseScratch(size_t mark) {}
  // Runs `ops`: a run of ops that reads and writes only weights, Scratch taken before the segment and
  // the step's metadata, that makes no host-visible change other than its own Scratch, and whose
  // launches are identical whenever `key` is. A backend may record the run once per key and replay the
  // record instead of calling `ops` (tensors `ops` allocates itself must not be used after it).
  struct SegmentKey {
    int site = 0;       // which run in the forward
    int layer = -1;
    int64_t rows = 0;   // the step's rows (the shapes the launches depend on)
    int64_t rows2 = 0;  // a second row count where the run has one (the head's rows)
    bool operator<(const SegmentKey& o) const {
      return std::tie(site, layer, rows, rows2) < std::tie(o.site, o.layer, o.rows, o.rows2);
    }
  };
  virtual void Segment(const SegmentKey& key, const std::function<void()>& ops) { ops(); }
  // Runs `ops`: the stateful part of a block (compressors, indexer, attention, ring writes), whose host
  // logic reads and updates sequence states and must run every step, but whose launches (not their
  // parameters) are identical whenever `key` and the step's positions' bucket are. A device backend may
  // record the launches once and afterwards run `ops` only to collect each op's parameters, then replay
  // the record with them. Only ops that support that may run inside: AddPositionBias, CompressorStep,
  // IndexerTopK(Batch), Attention(Batch), RingWriteBatch and Scratch.
  virtual void StatefulSegment(const SegmentKey& key, const std::function<void()>& ops) { ops(); }
  // Runs `ops`: one whole block of a decode step whose Segments and StatefulSegment follow each other with
  // nothing else launched between them (one rank: no collective). `key` must tell apart every launch shape
  // its parts' keys do. A device backend may record the block as one graph (its parts recorded alone
  // first) and afterwards run `ops` only for the stateful part's parameters, as StatefulSegment does.
  virtual void BlockSegment(const SegmentKey& key, const std::function<void()>& ops) { ops(); }

  // Device memory in use and in all, one line ("" for host backends): for benchmark reports.
  virtual std::string MemoryDescription() const { return ""; }

  // ---- profiling (dsmesh bench --profile) ----
  // While on, a device backend times every op (and every step) with device events and runs segments
  // eagerly; TakeOpProfile returns the totals since the last call, largest first. A backend that cannot
  // time ops returns nothing.
  virtual void SetOpProfiling(OpProfiling mode) {}
  virtual OpProfile TakeOpProfile() { return {}; }
  // While on, a backend that replays graphs notes which graphs each step replays (and their shapes);
  // TakeStepGraphs returns the last traced step's (kernels/graph_shape.h) and, with replays > 0, times
  // them replayed back to back as recorded and with empty kernels (the chain of dependent launches
  // alone). A backend without graphs returns an empty profile.
  virtual void TraceStepGraphs(bool on) {}
  virtual StepGraphProfile TakeStepGraphs(int replays) { return {}; }
  // The forward names the phase its next ops belong to (OpTiming::op is then "phase / op"); phases nest
  // by replacement, EndPhase restores the enclosing one.
  virtual void BeginPhase(const char* phase) {}
  virtual void EndPhase() {}

  // Prepares an EXL3 linear from the checkpoint tensors `<prefix>.trellis/.suh/.svh[/.mcg|.mul1][/.bias]`
  // whose logical size is [out_features, in_features], keeping output rows [out_begin, out_end) and input
  // columns [in_begin, in_end) (the tensor-parallel slice). Throws naming the prefix when it cannot.
  virtual LinearWeight LoadExl3Linear(const Checkpoint& ckpt, const std::string& prefix, int64_t out_features,
                                      int64_t in_features, int64_t out_begin, int64_t out_end, int64_t in_begin,
                                      int64_t in_end) = 0;
  // The same slice of a synthetic MCG EXL3 linear of K bits (kernels/exl3/synthetic_exl3.h: random valid
  // trellises from `seed`), generated where the backend keeps weights; both backends give the same bits.
  virtual LinearWeight SyntheticExl3Linear(const std::string& name, int64_t out_features, int64_t in_features,
                                           int64_t out_begin, int64_t out_end, int64_t in_begin, int64_t in_end,
                                           int K, uint64_t seed) = 0;

  // ---- elementwise and normalisation ----
  // out[i, :] = table[tokens[i], :] as f32.  table [vocab, D] any float dtype.
  virtual void Embedding(const Tensor& table, const int32_t* tokens, int64_t n, Tensor* out) = 0;
  // RMSNorm over the last `dim` values of each of the numel/dim groups: x * rsqrt(mean(x^2) + eps) * w.
  // weight may be null (unweighted). out may alias x.
  virtual void RmsNorm(const Tensor& x, int64_t dim, const Tensor* weight, float eps, Tensor* out) = 0;
  virtual void Add(const Tensor& a, Tensor* acc) = 0;          // acc += a (same numel)
  virtual void Scale(Tensor* x, float s) = 0;                  // x *= s

  // ---- linear ----
  virtual void Linear(const Tensor& x, const LinearWeight& w, Tensor* out) = 0;  // x [n, in] -> [n, out]
  // Grouped: x [n, groups*w.in] -> out [n, groups*(w.out/groups)]; group g uses rows
  // [g*w.out/groups, (g+1)*w.out/groups) of W on input columns [g*w.in, (g+1)*w.in).
  virtual void GroupedLinear(const Tensor& x, const LinearWeight& w, int groups, Tensor* out) = 0;
  // Linears that do not depend on one another (no job reads another's output); a device backend may run
  // them concurrently. Results are those of calling Linear for each job.
  struct LinearJob {
    const Tensor* x;
    const LinearWeight* w;
    Tensor* out;
  };
  virtual void LinearBatch(const std::vector<LinearJob>& jobs) {
    for (const LinearJob& j : jobs) Linear(*j.x, *j.w, j.out);
  }

  // ---- rotary embedding: interleaved pairs on the LAST rope_dim values of each head ----
  // x [n, heads * head_dim]; angle of pair i for row r = positions[r] * inv_freq[i] (f32 product);
  // inverse rotates by -angle (the attention output "de-rope").
  virtual void Rope(Tensor* x, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
                    const std::vector<float>& inv_freq, bool inverse) = 0;

  // ---- hyper-connections (hc = number of residual streams) ----
  // X [n, hc*D]. fn [(2+hc)*hc, hc*D] f32, base [(2+hc)*hc], scale [3]. Produces y [n, D] = sum_i pre_i X_i,
  // post [n, hc] and the Sinkhorn-normalised comb [n, hc*hc] (comb[i*hc + j]).
  virtual void HcPre(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc,
                     int sinkhorn_iters, float eps, float norm_eps, Tensor* y, Tensor* post, Tensor* comb) = 0;
  // HcPre, then RmsNorm(y, D, y_norm, y_norm_eps, y) in place: a block's attention and FFN inputs. A
  // backend may do both in one pass (the CUDA backend does); this default runs the two ops.
  virtual void HcPreNorm(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc,
                         int sinkhorn_iters, float eps, float norm_eps, const Tensor* y_norm, float y_norm_eps,
                         Tensor* y, Tensor* post, Tensor* comb) {
    HcPre(X, fn, base, scale, hc, sinkhorn_iters, eps, norm_eps, y, post, comb);
    if (X.shape[0] > 0) RmsNorm(*y, y->numel() / X.shape[0], y_norm, y_norm_eps, y);
  }
  // X[r, i*D:(i+1)*D] = h[r, :] for every stream i (the residual starts as hc copies of the embedding).
  virtual void HcExpand(const Tensor& h, int hc, Tensor* X) = 0;
  // X'[j] = post[j] * f + sum_i comb[i][j] * X[i].  out must not alias X.
  virtual void HcPost(const Tensor& X, const Tensor& f, const Tensor& post, const Tensor& comb, int hc,
                      Tensor* out) = 0;
  // The head's collapse: fn [hc, hc*D], base [hc], scale [1]; y = sum_i (sigmoid(mix_i*scale+base_i)+eps) X_i.
  virtual void HcHead(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc,
                      float eps, float norm_eps, Tensor* y) = 0;

  // ---- compressor ----
  // score[r, :] += ape[positions[r] % ratio, :]   (score [n, c*d], ape [ratio, c*d] f32; positions: n host values)
  virtual void AddPositionBias(Tensor* score, const Tensor& ape, const int64_t* positions, int ratio) = 0;
  // Pools windows [first_window, first_window + num_windows) into out [num_windows, d].
  // kv/score [rows, c*d] hold consecutive positions starting at base_pos (which must cover the windows
  // used: window w spans positions w*ratio .. w*ratio+ratio-1; with overlap, window w-1 too).
  // Without overlap (c = 1): entry = sum over the window's tokens of softmax_tokens(score) * kv, per channel.
  // With overlap (c = 2): per channel, softmax over 2*ratio slots: window w-1's first halves ([0, d)) and
  // window w's second halves ([d, 2d)); window -1 is absent.
  virtual void CompressorPool(const Tensor& kv, const Tensor& score, int64_t base_pos, int64_t first_window,
                              int64_t num_windows, int ratio, bool overlap, int64_t d, Tensor* out) = 0;

  // Stores `rows` f32 rows of src (from src_row; [., dim]) as rows dst_row.. of a state pool tensor in its
  // storage (kernels/kv_rows.h): F32 rows as they are, BF16 rows of dim values, U8 rows in the fp8 layout
  // with `rope_dim` bf16 rope values. Bit for bit EncodeKvRows on every backend.
  virtual void StoreKvRows(const Tensor& src, int64_t src_row, int64_t rows, int64_t rope_dim, Tensor* dst,
                           int64_t dst_row) = 0;

  // One step of a compressor for several sequences. Sequence i's rows seqs[i].offset .. + count - 1 of kv
  // and score are positions start .. start+count-1; the score rows carry the position bias, or with
  // spec.ape the op adds it first (AddPositionBias: ape[position % ratio]). Each window w these
  // rows complete (num_entries <= w < (start+count)/ratio) is pooled as CompressorPool does, normed
  // (RmsNorm with spec.norm), roped at its first position w*ratio (Rope on the trailing rope_dim values) and
  // stored as entry w of *entries (in the pool's storage, StoreKvRows with entries->rope_dim). Then each
  // open-window ring takes the last min(count, slots) rows (slot = position % slots). Rows before `start`
  // come from the rings, which must still hold them.
  struct CompressorSeq {
    int64_t offset = 0, count = 0, start = 0;
    int64_t num_entries = 0;          // entries emitted before this step
    Tensor* pending_kv = nullptr;     // rings [slots, (overlap ? 2 : 1) * dim]
    Tensor* pending_score = nullptr;
    const PagedRows* entries = nullptr;
  };
  struct CompressorSpec {
    int ratio = 0;
    bool overlap = false;
    int64_t dim = 0;        // entry width
    int64_t rope_dim = 0;   // trailing dims roped
    const Tensor* norm = nullptr;
    float eps = 0.0f;
    const std::vector<float>* inv_freq = nullptr;
    const Tensor* ape = nullptr;  // [ratio, (overlap ? 2 : 1) * dim], or null when score has it added
  };
  virtual void CompressorStep(const Tensor& kv, const Tensor& score, const CompressorSpec& spec,
                              const std::vector<CompressorSeq>& seqs);

  // Rows src_row .. src_row + n - 1 of src (positions pos .. pos + n - 1) into their ring slots (slot =
  // position % ring->shape[0]; n <= slots), for several rings at once, in any order (no two writes may
  // touch the same slot). The default splits each write at the ring's end into CopyRowsBatch.
  struct RingWrite {
    const Tensor* src = nullptr;
    int64_t src_row = 0, pos = 0, n = 0;
    Tensor* ring = nullptr;
  };
  virtual void RingWriteBatch(const std::vector<RingWrite>& writes);

  // ---- lightning indexer ----
  // q [n, heads*dim], weights [n, heads], keys: >= num_keys rows of dim. For query row r at position
  // positions[r], score(w) = sum_h weights[r,h] * relu(q[r,h] . keys[w]) over w < (pos+1)/ratio;
  // out int32 [n, top_k] gets the top-k w by score (ties: lower w first), -1 where fewer exist.
  virtual void IndexerTopK(const Tensor& q, const Tensor& weights, const PagedRows& keys, int64_t num_keys,
                           int64_t heads, int64_t dim, const int64_t* positions, int ratio, int top_k,
                           Tensor* out) = 0;

  // IndexerTopK for several sequences of one step at once: sequence i owns rows seqs[i].offset .. + count - 1
  // of q, weights, positions and out and reads its own keys. Equal to IndexerTopK per sequence (the
  // default does exactly that); a device backend may run them as one launch.
  struct IndexerSeq {
    int64_t offset = 0, count = 0;
    const PagedRows* keys = nullptr;
    int64_t num_keys = 0;
  };
  virtual void IndexerTopKBatch(const Tensor& q, const Tensor& weights, int64_t heads, int64_t dim,
                                const int64_t* positions, int ratio, int top_k, const std::vector<IndexerSeq>& seqs,
                                Tensor* out);

  // ---- attention (one sequence) ----
  // q [n, heads*d] for positions start .. start+n-1. The shared K=V rows are:
  //   window: positions max(0, t-window+1) .. t; positions < start come from ring [slots, d]
  //   (slots = ring.shape[0] >= window; slot pos % slots), positions >= start from new_kv [n, d];
  //   compressed (ratio > 0): entries (>= num_entries rows of d); with topk (int32 [n, k], -1 = none) the listed
  //   entries, else all entries w < (t+1)/ratio.
  // p_j = exp(s_j) / (sum_j exp(s_j) + exp(sink_h)), s_j = q.k_j * softmax_scale; out [n, heads*d] = sum p_j k_j.
  virtual void Attention(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring,
                         const Tensor& new_kv, int window, const PagedRows* entries, int64_t num_entries,
                         int ratio, const Tensor* topk, const Tensor& sinks, float softmax_scale,
                         Tensor* out) = 0;
  // Attention for several sequences of one step at once: sequence i owns rows seqs[i].offset ..
  // + count - 1 of q, new_kv, topk and out, starts at position seqs[i].start and has its own ring and
  // entries; everything else is Attention's. Equal to Attention per sequence (the default does exactly
  // that); a device backend may run them as one launch.
  struct AttentionSeq {
    int64_t offset = 0, count = 0, start = 0;
    const Tensor* ring = nullptr;
    const PagedRows* entries = nullptr;  // null for sliding-window layers
    int64_t num_entries = 0;
  };
  virtual void AttentionBatch(const Tensor& q, int64_t heads, int64_t d, const Tensor& new_kv, int window, int ratio,
                              const Tensor* topk, const Tensor& sinks, float softmax_scale,
                              const std::vector<AttentionSeq>& seqs, Tensor* out);
  // Writes the last min(n, slots) rows of new_kv (positions start..start+n-1) into the ring (slot pos % slots,
  // slots = ring->shape[0] >= window). A ring with window + k slots lets k rows be written and then
  // forgotten (speculative rollback) without overwriting a row the window still needs.
  virtual void UpdateRing(const Tensor& new_kv, int64_t start, int window, Tensor* ring) = 0;
  // Attention with image spans (docs/vision.md): as Attention, except that query row r sees the window
  // positions visible_from[r] .. visible_to[r] (host arrays, absolute positions) instead of
  // max(0, t-window+1) .. t. A row inside an image span [s, e] sees max(0, min(t-window+1, s)) .. e
  // (bidirectional within the span); other rows pass the causal bounds. Bounds must satisfy
  // min(t-window+1, start) <= visible_from <= t <= visible_to < start + n (positions before `start` come
  // from the ring, so no further back than the window). Compressed entries stay causal.
  virtual void SpanWindowAttention(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring,
                                   const Tensor& new_kv, int window, const int64_t* visible_from,
                                   const int64_t* visible_to, const PagedRows* entries, int64_t num_entries,
                                   int ratio, const Tensor* topk, const Tensor& sinks, float softmax_scale,
                                   Tensor* out) {
    NotImplemented("SpanWindowAttention");
  }
  // Whether this backend runs steps with image rows (given embeddings, bias_vl routing, span attention).
  // The forward refuses such a step up front on a backend that does not, before any state has moved.
  virtual bool supports_image_rows() const { return false; }

  // ---- mixture of experts ----
  // logits [n, E] (router linear output). idx int32 [n, k], weight f32 [n, k].
  // scores = sqrt(softplus(logits)); experts = hash ? tid2eid[tokens] : top_k(scores + bias);
  // weight = scores[e] (/ sum) * routed_scale.
  virtual void MoeRoute(const Tensor& logits, const int32_t* tokens, const RouterParams& p, Tensor* idx,
                        Tensor* weight) = 0;
  // out [n, D] += sum_k weight[r,k] * expert_{idx[r,k]}(x[r]).  experts may hold only this rank's slice.
  virtual void MoeExperts(const Tensor& x, const Tensor& idx, const Tensor& weight,
                          const std::vector<ExpertWeights>& experts, float swiglu_limit, Tensor* out) = 0;
  // out [n, D] = the same sum, whatever out held before (the MoE block's first term). The default zeroes
  // out and runs MoeExperts; a device backend may write the sum straight into out instead.
  virtual void MoeExpertsInto(const Tensor& x, const Tensor& idx, const Tensor& weight,
                              const std::vector<ExpertWeights>& experts, float swiglu_limit, Tensor* out) {
    Zero(out);
    MoeExperts(x, idx, weight, experts, swiglu_limit, out);
  }
  // out [n, D] += expert(x) (the shared expert).
  virtual void SharedExpert(const Tensor& x, const ExpertWeights& expert, float swiglu_limit, Tensor* out) = 0;

  // ---- sampling (kernels/sampling/row_sampler.h) ----
  // Samples every row of `logits` [rows.size(), vocab] (the head's output, whole vocabulary) by its
  // RowSampling and returns what the host needs: the token, and its logprob and the top-n when asked.
  // The same result as SampleRow on the host copy of the row (tokens exactly; logprobs to about a float
  // ulp, as the device sums exp in another order). Not inside a Segment (the results come back to the
  // host). Not pure: a backend that cannot sample throws "SampleRows is not implemented on <backend>".
  virtual std::vector<SampledRow> SampleRows(const Tensor& logits, const std::vector<RowSampling>& rows) {
    NotImplemented("SampleRows");
  }
  // ids I32 [rows] (backend memory) = the lowest id of the largest value of each row of logits f32 [rows,
  // vocab] (NaN never; 0 for a row of NaN): greedy SampleRows' tokens, left where the logits are, so that a
  // later op can take them (EmbeddingIds) without a trip through the host. May run inside a Segment when
  // the backend overrides it; the default samples on the host side and copies the ids back.
  virtual void ArgmaxRows(const Tensor& logits, Tensor* ids);
  // Embedding of token ids held in backend memory (ids I32 [n], e.g. ArgmaxRows'): out [n, D]. The ids
  // are trusted to lie inside the table (a device backend cannot check them without a host sync). The
  // default copies them to the host and calls Embedding.
  virtual void EmbeddingIds(const Tensor& table, const Tensor& ids, Tensor* out);

  // ---- vision encoder (a ViT and its aligner; model/vision_tower.cc) ----
  // Not pure: a backend that has not written them yet throws "<op> is not implemented on <backend>".
  //
  // Rotary embedding over rotate-half pairs with an angle per row and pair: x [n, heads * head_dim]; in
  // every head, (x[i], x[i + head_dim/2]) is rotated by angles[r, i] (angles f32 [n, head_dim/2], backend
  // memory). The 2D RoPE of a ViT puts a patch's row angles in one part of `angles` and its column angles
  // in the other.
  virtual void RotateHalf(Tensor* x, int64_t heads, int64_t head_dim, const Tensor& angles) {
    NotImplemented("RotateHalf");
  }
  // Bidirectional attention inside spans: rows [spans[s], spans[s+1]) attend to every row of their own span
  // and to no other (one span per image). q, k, v [n, heads*d], spans a host array of num_spans+1 row
  // offsets from 0 to n. out[r, h] = sum_j softmax_j(q[r,h] . k[j,h] * softmax_scale) v[j,h]; no sink.
  virtual void SpanAttention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads, int64_t d,
                             const int64_t* spans, int64_t num_spans, float softmax_scale, Tensor* out) {
    NotImplemented("SpanAttention");
  }
  // x = x * (1 + erf(x / sqrt(2))) / 2 (exact GELU, torch's default), in place.
  virtual void Gelu(Tensor* x) { NotImplemented("Gelu"); }
  // Non-overlapping r x r blocks of an h x w grid of C-wide rows (row-major): x [h*w, C] ->
  // out [ceil(h/r) * ceil(w/r), C*r*r], blocks row-major, feature c*r*r + dy*r + dx (torch's F.unfold
  // order), zeros for cells past the grid's bottom or right edge.
  virtual void Unfold2D(const Tensor& x, int64_t h, int64_t w, int r, Tensor* out) { NotImplemented("Unfold2D"); }

 private:
  [[noreturn]] void NotImplemented(const char* op) const {
    throw std::runtime_error(std::string(op) + " is not implemented on " + name());
  }
};

// Checks SpanWindowAttention's bounds (the rule in its comment above) for rows 0..n-1 of a step starting at
// `start`; throws std::runtime_error naming `who` and the first row outside them.
inline void CheckSpanWindowBounds(const char* who, int64_t n, int64_t start, int window, const int64_t* visible_from,
                                  const int64_t* visible_to) {
  if (!visible_from || !visible_to) throw std::runtime_error(std::string(who) + ": bounds missing");
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = start + r, earliest = std::max<int64_t>(0, std::min<int64_t>(t - window + 1, start));
    if (visible_from[r] < earliest || visible_from[r] > t || visible_to[r] < t || visible_to[r] >= start + n)
      throw std::runtime_error(std::string(who) + ": bounds of row " + std::to_string(r) +
                               " outside what the step holds");
  }
}

// A row range [begin, begin+count) of a row-major tensor (no copy; pointer arithmetic is valid for host
// and device pointers alike).
inline Tensor RowView(const Tensor& t, int64_t begin, int64_t count) {
  Tensor v = t;
  const int64_t row = t.shape.empty() || t.shape[0] == 0 ? 0 : t.numel() / t.shape[0];
  v.shape[0] = count;
  v.data = static_cast<char*>(t.data) + static_cast<size_t>(begin) * row * DTypeSize(t.dtype);
  return v;
}

inline void Backend::IndexerTopKBatch(const Tensor& q, const Tensor& weights, int64_t heads, int64_t dim,
                                      const int64_t* positions, int ratio, int top_k,
                                      const std::vector<IndexerSeq>& seqs, Tensor* out) {
  for (const IndexerSeq& s : seqs) {
    Tensor ov = RowView(*out, s.offset, s.count);
    IndexerTopK(RowView(q, s.offset, s.count), RowView(weights, s.offset, s.count), *s.keys, s.num_keys, heads, dim,
                positions + s.offset, ratio, top_k, &ov);
  }
}

inline void Backend::AttentionBatch(const Tensor& q, int64_t heads, int64_t d, const Tensor& new_kv, int window,
                                    int ratio, const Tensor* topk, const Tensor& sinks, float softmax_scale,
                                    const std::vector<AttentionSeq>& seqs, Tensor* out) {
  for (const AttentionSeq& s : seqs) {
    Tensor ov = RowView(*out, s.offset, s.count), tv;
    if (topk) tv = RowView(*topk, s.offset, s.count);
    Attention(RowView(q, s.offset, s.count), heads, d, s.start, *s.ring, RowView(new_kv, s.offset, s.count), window,
              s.entries, s.entries ? s.num_entries : 0, ratio, topk ? &tv : nullptr, sinks, softmax_scale, &ov);
  }
}

}  // namespace dsmesh

// The stateful writes of a step (model_ops.h, "stateful writes"): the compressors' new entries and the
// rings' new rows, for every sequence of a step in fixed-shape launches whose parameters are staged
// (ParamStager), so that a recorded graph replays them. CPU twins: Backend::CompressorStep and
// Backend::RingWriteBatch (kernels/backend.cc), which CompressorPool, RmsNorm, Rope, StoreKvRows and
// CopyRowsBatch make up there; tested against them in cuda_backend_test.cc.
// Every kernel here is launched through PdlLaunch (pdl_launch.cuh) and starts with PdlWait() (it reads
// the previous kernels' output from its first load on; its prologue is index math only) and then
// PdlTrigger(), so that with programmatic dependent launch the next kernel's launch overlaps all of it.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/kv_rows_device.cuh"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/model_ops_device.cuh"
#include "kernels/cuda/pdl_launch.cuh"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kCompressorMaxSeqs = 8;
constexpr int kCompressorThreads = 256;
constexpr int64_t kCompressorMaxDim = 1024;  // the entry row lives in shared memory
constexpr int kCompressorMaxWindowRows = 256;  // rows one window pools ((overlap ? 2 : 1) * ratio)
// A step whose sequences can each complete at most this many windows (decode and verification rows) runs
// in one launch: one block per sequence pools its windows in turn and then writes its rings. More windows
// (prefill chunks) take one block per window and the rings in a second launch.
constexpr int kCompressorSerialMaxWindows = 4;
constexpr int kPoolBatch = 8;  // slot rows whose loads a thread issues before it uses them
constexpr int kRingWritesMax = 16;

struct CompressorBatch {
  CompressorStepArgs args;
  CompressorSeqDev seq[kCompressorMaxSeqs];
  int windows = 1;  // the most windows one sequence can complete this step
  int per_seq = 1;  // blocks per sequence: `windows` (one window each), or 1 (all of them, then the rings)
};

// Slot sl's score at channel ch, its position bias added where the slot has one.
__device__ __forceinline__ float BiasedScore(const float* const* score_rows, const float* const* bias_rows, int sl,
                                             int64_t ch) {
  const float v = score_rows[sl][ch];
  return bias_rows[sl] ? v + bias_rows[sl][ch] : v;
}

// Window w of sequence sq: the pooled row (CompressorPoolKernel's sums), then RmsNormKernel's and
// RopeKernel's arithmetic on it in shared memory, then the row in the pool's storage (EncodeKvRowsKernel's).
// Rows before the sequence's start come from its ring (slot = position % slots), the others from this
// step's kv/score rows, their score plus the position bias row when args.ape is given (AddPositionBiasKernel's
// sum; the rings hold it added). The slots' row addresses are worked out once per window (one integer division
// each) into shared memory; each thread then issues kPoolBatch slots' loads of a channel before it uses
// them, so that a window of S slots ((overlap ? 2 : 1) ratio) costs S / kPoolBatch memory round trips per
// pass, not S (the pooled sums still take the slots in order: the same arithmetic as a plain loop).
__device__ __forceinline__ void PoolWindow(const CompressorStepArgs& a, const CompressorSeqDev& sq, int64_t w, float* row,
                                           const float** kv_rows, const float** score_rows, const float** bias_rows) {
  const int ratio = a.ratio;
  const int64_t d = a.dim, width = a.overlap ? 2 * d : d;
  const bool prev = a.overlap && w >= 1;
  const int slots = (prev ? ratio : 0) + ratio;
  __syncthreads();  // the previous window's readers of the tables and of row are done
  for (int sl = threadIdx.x; sl < slots; sl += blockDim.x) {
    int64_t p, col;
    if (prev && sl < ratio) {
      p = (w - 1) * ratio + sl;
      col = 0;
    } else {
      p = w * ratio + (prev ? sl - ratio : sl);
      col = a.overlap ? d : 0;
    }
    const bool old = p < sq.start;
    const int64_t at = (old ? p % sq.ring_slots : sq.offset + p - sq.start) * width + col;
    kv_rows[sl] = (old ? sq.ring_kv : a.kv) + at;
    score_rows[sl] = (old ? sq.ring_score : a.score) + at;
    bias_rows[sl] = old || !a.ape ? nullptr : a.ape + (p % ratio) * width + col;
  }
  __syncthreads();
  for (int64_t ch = threadIdx.x; ch < d; ch += blockDim.x) {
    float mx = -INFINITY;
    for (int s0 = 0; s0 < slots; s0 += kPoolBatch) {
      float v[kPoolBatch];
#pragma unroll
      for (int j = 0; j < kPoolBatch; ++j) v[j] = s0 + j < slots ? BiasedScore(score_rows, bias_rows, s0 + j, ch) : -INFINITY;
#pragma unroll
      for (int j = 0; j < kPoolBatch; ++j) mx = fmaxf(mx, v[j]);
    }
    float sum = 0.0f, acc = 0.0f;
    for (int s0 = 0; s0 < slots; s0 += kPoolBatch) {
      float sc[kPoolBatch], kv[kPoolBatch];
#pragma unroll
      for (int j = 0; j < kPoolBatch; ++j)
        if (s0 + j < slots) {
          sc[j] = BiasedScore(score_rows, bias_rows, s0 + j, ch);
          kv[j] = kv_rows[s0 + j][ch];
        }
#pragma unroll
      for (int j = 0; j < kPoolBatch; ++j)
        if (s0 + j < slots) {
          const float e = expf(sc[j] - mx);
          sum += e;
          acc += e * kv[j];
        }
    }
    row[ch] = acc / sum;
  }
  // RmsNorm (each thread rescales the channels it summed).
  float ss = 0.0f;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) ss += row[k] * row[k];
  const float r = 1.0f / sqrtf(BlockSum(ss) / static_cast<float>(d) + a.eps);
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) row[k] = a.norm ? a.norm[k] * (row[k] * r) : row[k] * r;
  __syncthreads();
  // Rope at the window's first position on the trailing rope_dim values.
  const float pos = static_cast<float>(w * ratio);
  float* rp = row + (d - a.rope_dim);
  for (int64_t i = threadIdx.x; i < a.rope_dim / 2; i += blockDim.x) {
    const float angle = pos * a.inv_freq[i];
    const float cs = cosf(angle), sn = sinf(angle);
    const float x0 = rp[2 * i], x1 = rp[2 * i + 1];
    rp[2 * i] = x0 * cs - x1 * sn;
    rp[2 * i + 1] = x1 * cs + x0 * sn;
  }
  __syncthreads();
  // Entry w in the pool's storage.
  const PagedRowsDev& to = sq.entries;
  BlockEncodeKvRow(row, d, to.kind == RowKind::kFp8 ? to.nope : d, to.kind,
                   static_cast<uint8_t*>(const_cast<void*>(to.Row(w))));
}

// Block b: sequence b / per_seq, its windows num_entries + b % per_seq, + per_seq, ... that the step's rows
// complete. With one block per sequence it then writes the sequence's rings (the last min(count, slots)
// rows), after a barrier: every read of the rings this step (the pooling) is done by then, and no other
// block touches them.
__global__ void __launch_bounds__(kCompressorThreads, 2) CompressorStepKernel(const CompressorBatch* __restrict__ batch) {
  PdlWait();
  PdlTrigger();
  __shared__ float row[kCompressorMaxDim];
  __shared__ const float* kv_rows[kCompressorMaxWindowRows];
  __shared__ const float* score_rows[kCompressorMaxWindowRows];
  __shared__ const float* bias_rows[kCompressorMaxWindowRows];
  const CompressorStepArgs& a = batch->args;
  const int per = batch->per_seq;
  const CompressorSeqDev& sq = batch->seq[blockIdx.x / per];
  const int64_t end = sq.start + sq.count;
  for (int j = blockIdx.x % per; j < batch->windows; j += per) {
    const int64_t w = sq.num_entries + j;
    if (w >= end / a.ratio) break;  // the same for the whole block
    PoolWindow(a, sq, w, row, kv_rows, score_rows, bias_rows);
  }
  if (per != 1) return;
  __syncthreads();
  const int64_t width = a.overlap ? 2 * a.dim : a.dim;
  const int64_t keep = sq.count < sq.ring_slots ? sq.count : sq.ring_slots;
  for (int64_t i = 0; i < keep; ++i) {
    const int64_t pos = end - keep + i;
    const int64_t src = (sq.offset + sq.count - keep + i) * width, dst = (pos % sq.ring_slots) * width;
    const float* bias = a.ape ? a.ape + (pos % a.ratio) * width : nullptr;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      sq.ring_kv[dst + c] = a.kv[src + c];
      sq.ring_score[dst + c] = bias ? a.score[src + c] + bias[c] : a.score[src + c];
    }
  }
}

struct RingWrites {
  RingWriteDev w[kRingWritesMax];
};

// blockIdx.x = write, blockIdx.y = its row (rows past the write's n return).
__global__ void RingWriteKernel(const RingWrites* __restrict__ writes) {
  PdlWait();
  PdlTrigger();
  const RingWriteDev& wr = writes->w[blockIdx.x];
  const int64_t i = blockIdx.y;
  if (i >= wr.n) return;
  const float* src = wr.src + (wr.src_row + i) * wr.width;
  float* dst = wr.ring + ((wr.pos + i) % wr.slots) * wr.width;
  const float* add = wr.add ? wr.add + ((wr.pos + i) % wr.add_period) * wr.width : nullptr;
  for (int64_t c = threadIdx.x; c < wr.width; c += blockDim.x) dst[c] = add ? src[c] + add[c] : src[c];
}

}  // namespace

int CompressorStepMaxSeqs() { return kCompressorMaxSeqs; }
int64_t CompressorStepMaxDim() { return kCompressorMaxDim; }
int CompressorStepMaxWindowRows() { return kCompressorMaxWindowRows; }

void CompressorStep(const CompressorStepArgs& args, const CompressorSeqDev* seqs, int num_seqs, ParamStager& stage,
                    cudaStream_t s) {
  if (num_seqs < 1 || num_seqs > kCompressorMaxSeqs)
    throw std::runtime_error("cuda CompressorStep: " + std::to_string(num_seqs) + " sequences (at most " +
                             std::to_string(kCompressorMaxSeqs) + ")");
  if (args.dim > kCompressorMaxDim || args.rope_dim > args.dim || args.rope_dim % 2 != 0 || args.ratio < 1 ||
      (args.overlap ? 2 : 1) * static_cast<int64_t>(args.ratio) > kCompressorMaxWindowRows)
    throw std::runtime_error("cuda CompressorStep: entry width " + std::to_string(args.dim) + ", rope " +
                             std::to_string(args.rope_dim) + ", ratio " + std::to_string(args.ratio) +
                             " (width at most " + std::to_string(kCompressorMaxDim) + ", window rows at most " +
                             std::to_string(kCompressorMaxWindowRows) + ")");
  CompressorBatch batch{};
  batch.args = args;
  int64_t windows = 1;
  const int64_t width = (args.overlap ? 2 : 1) * args.dim;
  for (int i = 0; i < num_seqs; ++i) {
    const CompressorSeqDev& q = seqs[i];
    // The block count depends on the row counts only: count / ratio + 1 windows cover any start.
    windows = std::max<int64_t>(windows, q.count / args.ratio + 1);
    const int64_t fresh = (q.start + q.count) / args.ratio - q.num_entries;
    if (fresh > q.count / args.ratio + 1)
      throw std::runtime_error("cuda CompressorStep: a sequence completes " + std::to_string(fresh) +
                               " windows with " + std::to_string(q.count) + " rows");
    batch.seq[i] = q;
  }
  const bool one_launch = windows <= kCompressorSerialMaxWindows;
  batch.windows = static_cast<int>(windows);
  batch.per_seq = one_launch ? 1 : static_cast<int>(windows);
  const CompressorBatch* dev = stage.Stage(batch);
  if (stage.Launching())
    PdlLaunch(CompressorStepKernel, static_cast<unsigned>(num_seqs * batch.per_seq), kCompressorThreads, 0, s, dev);
  if (one_launch) return;  // the kernel wrote the rings
  // Then the rings (after the pooling read them): the last min(count, slots) rows of each sequence.
  RingWriteDev writes[2 * kCompressorMaxSeqs];
  for (int i = 0; i < num_seqs; ++i) {
    const CompressorSeqDev& q = seqs[i];
    const int64_t keep = q.count < q.ring_slots ? q.count : q.ring_slots, end = q.start + q.count;
    writes[2 * i] = {args.kv, q.offset + q.count - keep, end - keep, keep, q.ring_kv, q.ring_slots, width};
    writes[2 * i + 1] = {args.score, q.offset + q.count - keep, end - keep, keep, q.ring_score, q.ring_slots, width,
                         args.ape, args.ratio};
  }
  RingWriteBatch(writes, 2 * num_seqs, stage, s);
}

void RingWriteBatch(const RingWriteDev* writes, int num_writes, ParamStager& stage, cudaStream_t s) {
  for (int first = 0; first < num_writes; first += kRingWritesMax) {
    const int here = num_writes - first < kRingWritesMax ? num_writes - first : kRingWritesMax;
    RingWrites all{};
    int64_t most = 1;
    for (int i = 0; i < here; ++i) {
      const RingWriteDev& w = writes[first + i];
      if (w.n > w.slots) throw std::runtime_error("cuda RingWriteBatch: more rows than the ring's slots");
      all.w[i] = w;
      most = w.n > most ? w.n : most;
    }
    const RingWrites* dev = stage.Stage(all);
    if (stage.Launching())
      PdlLaunch(RingWriteKernel, dim3(static_cast<unsigned>(here), static_cast<unsigned>(most)), 128, 0, s, dev);
  }
}

}  // namespace dsmesh::cuda_ops

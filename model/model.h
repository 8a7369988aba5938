// The public face of the DeepSeek-V4 forward pass: load a (sharded) model, create per-sequence states,
// and run steps that advance a batch of sequences of different lengths in one call.
//
//   auto backend = MakeCpuBackend();                       // kernels/cpu/cpu_backend.h
//   LocalCommunicator comm;                                // or Gloo/NCCL (worker/)
//   auto model = LoadModel("/models/tiny", ShardSpec{0, 1}, backend, &comm);
//   auto a = model->NewState(), b = model->NewState();
//   auto out = model->Forward({{a.get(), {0, 17, 9}, false}, {b.get(), {0, 5}, true}});
//   // out[0].logits: f32 [1, vocab] (last position); out[1].logits: f32 [2, vocab]
//
// Tensor parallelism (ShardSpec{rank, world}); every rank runs the same Forward calls in the same order:
//   - attention: the query heads, split by output group (o_groups % world == 0): wq_b rows, attn_sink,
//     wo_a groups and the matching wo_b input columns. wq_a/q_norm/wkv/kv_norm, the compressors and the
//     indexer are replicated (the K=V head is shared by all query heads, so every rank keeps the full KV
//     state; replicating the indexer avoids a collective inside attention).
//     One AllReduceSum of the attention output per layer.
//   - MoE: routed and shared experts split along the intermediate dimension (all experts on every rank);
//     the router is replicated. One AllReduceSum of the MoE output per layer.
//   - embedding replicated; lm_head split by vocabulary rows, one AllGather of the logits at the end, so
//     every rank returns the full logits.
//   - hyper-connection mixing, norms and the residual streams are replicated (identical on all ranks).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/communicator.h"
#include "common/tensor.h"
#include "kernels/sampling/row_sampler.h"  // RowSampling, SampledRow
#include "model/config.h"
#include "model/state_pool.h"

namespace dsmesh {

class Backend;     // model/backend.h
class ModelImpl;   // model/model_impl.h
struct SequenceStateData;  // model/sequence_state.h

struct ShardSpec {
  int rank = 0;
  int world = 1;
};

// Everything one sequence has accumulated: per layer the sliding-window KV ring, the compressors' partial
// windows (and the CSA overlap half), the compressed KV entries and the indexer keys; with speculation
// also the MTP block's window and its input history (model/sequence_state.h).
// Buffers live in the memory of the backend that created the state. Not thread-safe; one sequence
// belongs to one Forward call at a time.
class SequenceState {
 public:
  ~SequenceState();
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  // Tokens consumed so far = position of the next token.
  int64_t length() const;
  // A copy that evolves independently of the original (prefix-cache snapshots): a new slot with a copy of
  // the fixed part; the blocks neither can write again are shared (reference-counted), the others copied.
  // Only for a pool that allocates its own blocks (not the worker's, whose coordinator plans them).
  std::unique_ptr<SequenceState> Clone() const;
  // The same for a pool the coordinator plans (the worker's): the copy takes `slot` and `blocks`; blocks
  // listed under the original's ids are shared, the others get a copy of the original's rows.
  std::unique_ptr<SequenceState> CloneInto(int slot, std::vector<int32_t> blocks) const;
  // Forgets positions >= `length` (rejected speculative rows): afterwards the state is exactly that of a
  // sequence that consumed only the first `length` tokens. At most speculative_tokens() positions may be
  // forgotten at once; throws otherwise. Rewinds counters only (every ring is addressed by position).
  void Rollback(int64_t length);
  // Positions that may be rolled back at once, and the most drafts Model::Draft may chain (NewState's k).
  int speculative_tokens() const;
  // Bytes this state holds now (all layers, this rank).
  size_t MemoryBytes() const;
  // Makes the block table hold `total_tokens` tokens (a locally allocating pool; throws when it is full).
  void Reserve(int64_t total_tokens);
  // The state pool's block ids holding this sequence's entries, block j for tokens [j, j+1) * block_tokens.
  const std::vector<int32_t>& block_table() const;
  // External pools (the worker): the coordinator's table for this sequence; blocks already written must
  // keep their ids. Throws naming a bad id.
  void SetBlockTable(std::vector<int32_t> blocks);

  SequenceStateData& data() { return *data_; }  // for the model implementation
  const SequenceStateData& data() const { return *data_; }
  explicit SequenceState(std::unique_ptr<SequenceStateData> data);

 private:
  std::unique_ptr<SequenceState> CopyInto(int slot, std::vector<int32_t> blocks) const;

  std::unique_ptr<SequenceStateData> data_;
};

// One sequence's part of a step.
// The image rows of one step (DeepSeek-V4-Flash-Vision; docs/vision.md "The language model's side"): every
// row of an image's sentinel block. Their input embeddings are given (the aligner's rows for IMAGE slots,
// the learned image_start/pad/newline/end vectors for the others: model/image_rows.h builds them), they route
// experts with bias_vl, and inside each span (IMAGE_START .. IMAGE_END) attention is bidirectional. A span
// must lie wholly inside one step. Empty for a text step, which then runs exactly as without images.
struct StepImageRows {
  std::vector<int64_t> rows;  // ascending indices into SequenceStep::tokens
  Tensor embeddings;          // host f32 [rows.size(), hidden_size], row i for tokens[rows[i]]
  struct Span {
    int64_t first = 0, last = 0;  // token indices of IMAGE_START and IMAGE_END (inclusive); image rows
  };
  std::vector<Span> spans;  // ascending, disjoint
  bool empty() const { return rows.empty(); }
};

struct SequenceStep {
  SequenceState* state = nullptr;  // advanced in place by tokens.size()
  std::vector<int32_t> tokens;     // new tokens, at positions state->length() .. + tokens.size() - 1
  bool all_logits = false;         // logits for every new token; false: only for the last one
  bool want_hidden = false;        // also return the last block's 4-stream residual (MTP input)
  // Sample on the backend instead of returning logits (SequenceOutput::samples), so that only tokens and
  // logprobs leave the device: the parameters of the sequence's first logits row; row r samples
  // position sampling->position + r. Honoured when every sequence of the batch sets it and the model
  // runs on one rank (tensor-parallel steps return logits); check SequenceOutput::samples.
  std::optional<RowSampling> sampling;
  StepImageRows images;            // image rows among tokens (a vision model on a backend that runs them)
};

// One sequence's part of a drafting call (Model::Draft).
struct DraftRequest {
  SequenceState* state = nullptr;
  int32_t next_token = -1;  // the token at position state->length() (sampled or accepted), or -1 when not
                            // known yet (a prefill chunk that is not the last: only catch the MTP window up)
  int num_drafts = 0;       // drafts wanted (<= state->speculative_tokens() + 1; 0 with next_token -1)
  // Picks draft step+1 (step 0 first) from that step's MTP logits (vocab floats); the choice is fed to the
  // next step. Empty: the argmax (greedy drafts), taken where the logits are.
  std::function<int32_t(int step, const float* logits)> choose;
  // Return the MTP logits of each draft (DraftResult::logits). Greedy drafts without it leave only their
  // tokens on the backend's side.
  bool want_logits = false;
};

struct DraftResult {
  std::vector<int32_t> tokens;  // the drafts, for positions length+1 .. length+num_drafts
  Tensor logits;                // with want_logits: host f32 [num_drafts, vocab], the MTP logits each draft
                                // was picked from; else empty
};

struct SequenceOutput {
  Tensor logits;  // host f32 [rows, vocab]; rows = tokens.size() if all_logits else 1 (empty when sampled)
  Tensor hidden;  // host f32 [rows, hc_mult * hidden_size] when want_hidden (pre hc_head / final norm)
  std::vector<SampledRow> samples;  // one per logits row when the step was sampled on the backend
};

class Model {
 public:
  ~Model();
  const ModelConfig& config() const;
  const ShardSpec& shard() const;
  Backend& backend() const;

  // A fresh state. speculative_tokens k > 0 (requires an MTP block) makes every ring k rows longer so that
  // k positions can be rolled back, and keeps the MTP block's window and input history for Draft.
  // The state lives in the model's state pool (created on first use with default options unless
  // ConfigureStatePool ran): a slot of its own (`slot`, required with an external pool) and blocks.
  std::unique_ptr<SequenceState> NewState(int speculative_tokens = 0, int slot = -1) const;
  // Sizes the state pool (model/state_pool.h); before the first NewState. Throws when the budget cannot
  // hold the slots and one block.
  const StatePool& ConfigureStatePool(const StatePoolOptions& options);
  const StatePool& state_pool() const;  // creates the default pool if none
  bool has_mtp() const;

  // Runs one step over a batch of sequences (each with >= 1 token, each state at most once in the batch).
  // Results per sequence are those of running it alone. Validates every token id (< vocab_size, >= 0)
  // before touching any state; throws std::runtime_error naming the bad id.
  std::vector<SequenceOutput> Forward(const std::vector<SequenceStep>& batch);

  // The MTP block (docs/model-v4.md section 5): for each sequence, brings the MTP window up to the state's
  // length from the target residuals Forward recorded (rows (X_t, token t+1); only the last
  // sliding_window positions matter, the block attends through its window only), then chains num_drafts
  // drafts (greedy, or picked by the request's `choose`): draft 1 from (X_{L-1}, next_token) at position L-1, draft i from the block's own output
  // state and draft i-1 at position L+i-2. The chained rows are forgotten afterwards (the MTP window ends
  // at position L-1). Every rank runs the same calls and gets the same drafts. With n MTP blocks, draft
  // i+1 comes from block min(i, n-1); block j's row for position t is (block j-1's output for t-1, token
  // t+1), its window caught up like block 0's (model/mtp.cc). Throws on a state without speculation.
  std::vector<DraftResult> Draft(const std::vector<DraftRequest>& batch);
  // The drafts' vocabulary (--speculative-config draft_vocab_size; FR-Spec / EAGLE-3's frequent-token
  // subset): Draft's logits then come from head rows [0, n) only, a copy of them on every rank (no
  // collective; WeightBytes and WeightsDescription count it), and every other id's logit is -inf, so drafts
  // (argmax or drawn) are ids < n and a sampled draft's distribution is the one it was drawn from.
  // Forward (verification) keeps the whole head. n is rounded up to a multiple of 128 for an EXL3 head (its
  // decode block); 0 or the vocabulary size: the whole head, the copy dropped. Returns draft_vocab_size().
  // Throws on n outside 0..vocab_size. Every rank must make the same call.
  int64_t SetDraftVocabulary(int64_t n);
  // Ids a draft can be (vocab_size unless SetDraftVocabulary chose fewer).
  int64_t draft_vocab_size() const;

  // Memory accounting for KV capacity planning on this rank:
  //   state bytes for a sequence of L tokens <= StateFixedBytes() + L * StateBytesPerToken().
  size_t StateBytesPerToken() const;  // compressed KV + indexer keys growth, all layers
  // window rings + compressor partial windows, all layers (+ the MTP window and input history with k > 0)
  size_t StateFixedBytes(int speculative_tokens = 0) const;

  // Bytes of weights this rank holds (after sharding).
  size_t WeightBytes() const;
  // How the weights are stored, one line (model/weights.h DescribeWeights): embedding dtype, head EXL3 K
  // or dense, EXL3 and dense linear counts.
  std::string WeightsDescription() const;

  ModelImpl& impl() { return *impl_; }
  explicit Model(std::unique_ptr<ModelImpl> impl);

 private:
  std::unique_ptr<ModelImpl> impl_;
};

// Loads config.json and the safetensors (DeepSeek or transformers tensor naming, dense or EXL3 linears)
// from `dir`, keeping only `shard`'s slice. `dir` may instead be a synthetic source
// ("synthetic:v4-flash[:seed=S,experts=2,dense=6]", model/testing/synthetic.h): weights built from a seed. `comm` must outlive the model; nullptr means a
// LocalCommunicator (then shard.world must be 1). Throws std::runtime_error naming the directory, file,
// tensor or config field on any problem (missing dir, unsupported config, missing tensor, bad shape).
std::unique_ptr<Model> LoadModel(const std::string& dir, const ShardSpec& shard,
                                 std::shared_ptr<Backend> backend, Communicator* comm = nullptr);

}  // namespace dsmesh

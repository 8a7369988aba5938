// The implementation behind Model: loaded weights of one shard, the rope tables, and the forward pass
// written once against the Backend interface.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/communicator.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/sequence_state.h"
#include "model/testing/synthetic.h"
#include "model/weights.h"

namespace dsmesh {

// The forward's graph segments (Backend::SegmentKey::site): runs of per-token ops, and the stateful work
// between them (kAttentionCoreSite: compressors, indexer, attention against each sequence's own state,
// Backend::StatefulSegment), split at the collectives. The MTP blocks' segments are keyed by their layer
// (num_layers + block), so they never meet the target's.
enum SegmentSite {
  kEmbedSite = 1,
  kAttentionInputSite,
  kAttentionOutputSite,
  kFfnSite,
  kHeadSite,
  kAttentionCoreSite,
  kDraftHeadSite,  // the drafts' vocabulary subset (ModelWeights::draft_head)
  kMtpInputSite,   // an MTP block's input rows (ModelImpl::MtpInput)
  kOutputFfnSite,  // on one rank (no collective between them): attention output, FFN and the block's hc post
  kBlockSite,      // on one rank: a whole block (Backend::BlockSegment) around the three above
};

// A backend step (Backend::BeginStep .. EndStep) for as long as it lives: the rows' tokens, positions and
// block tables reach the backend once, and the step's Scratch is released at its end. The arrays must
// outlive it unchanged (ops of the step are passed pointers into them).
class BackendStep {
 public:
  BackendStep(Backend& be, const std::vector<int32_t>& tokens, const std::vector<int64_t>& positions,
              const std::vector<int32_t>& tables = {})
      : be_(be) {
    try {
      be_.BeginStep(Backend::StepMetadata{tokens.data(), positions.data(), static_cast<int64_t>(tokens.size()),
                                          tables.data(), static_cast<int64_t>(tables.size())});
    } catch (...) {
      be_.EndStep();
      throw;
    }
  }
  // A step without rows of its own (ops on rows other steps made, such as a draft head).
  explicit BackendStep(Backend& be) : BackendStep(be, kNoTokens, kNoPositions) {}
  ~BackendStep() { be_.EndStep(); }
  BackendStep(const BackendStep&) = delete;
  BackendStep& operator=(const BackendStep&) = delete;

 private:
  static inline const std::vector<int32_t> kNoTokens;
  static inline const std::vector<int64_t> kNoPositions;
  Backend& be_;
};

// Names the phase of the ops inside its scope for the backend's profiler (dsmesh bench --profile).
class Phase {
 public:
  Phase(Backend& be, const char* name) : be_(be) { be_.BeginPhase(name); }
  ~Phase() { be_.EndPhase(); }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  Backend& be_;
};

class ModelImpl {
 public:
  ModelImpl(ModelConfig config, ShardSpec shard, std::shared_ptr<Backend> backend, Communicator* comm);

  void Load(const std::string& dir);
  void LoadSynthetic(const SyntheticSpec& spec);

  const ModelConfig& config() const { return config_; }
  const ShardSpec& shard() const { return shard_; }
  Backend& backend() const { return *backend_; }
  const ModelWeights& weights() const { return weights_; }
  // The collectives among this model's tensor-parallel ranks (the vision tower's sums run over them).
  Communicator& comm() const { return *comm_; }

  std::unique_ptr<SequenceState> NewState(int speculative_tokens, int slot) const;
  StatePool& state_pool() const;  // the default pool on first use
  const StatePool& ConfigureStatePool(const StatePoolOptions& options);
  std::vector<SequenceOutput> Forward(const std::vector<SequenceStep>& batch);
  std::vector<DraftResult> Draft(const std::vector<DraftRequest>& batch);  // model/mtp.cc
  // Drafts over head rows [0, n) (rounded up to the EXL3 block of 128 for an EXL3 head; 0 or >= vocab: the
  // whole head, no extra weights), loaded from the model's source on every rank. Returns the rows in use.
  int64_t SetDraftVocabulary(int64_t n);
  int64_t draft_vocab_size() const { return weights_.draft_rows > 0 ? weights_.draft_rows : config_.vocab_size; }
  double StateBytesPerToken() const;
  size_t StateFixedBytes(int speculative_tokens) const;

 private:
  // Where one sequence's rows sit in the step's flattened token dimension.
  struct SeqRows {
    SequenceStateData* state;
    int64_t offset;  // first row in the step
    int64_t count;   // new tokens
    int64_t start;   // position of the first new token
    const int32_t* table = nullptr;  // its block table in the step's array (BeginStep); null: the state's own
    const StepImageRows* images = nullptr;  // its image rows, or null for a text step
  };

  void Validate(const std::vector<SequenceStep>& batch) const;
  void ValidateImages(const SequenceStep& step, const std::string& where) const;
  // Writes the steps' given image embeddings over the looked-up token embeddings h [N, D].
  void PlaceImageEmbeddings(const std::vector<SeqRows>& seqs, Tensor* h);
  // One block's activations that cross its segments (Backend::Segment), taken from Scratch up front so
  // that their addresses depend only on the step's row count.
  struct BlockActivations {
    Tensor y, post, comb, X2, attn_out, moe_out;  // hyper-connection mixes and the two sublayer outputs
    Tensor qr, q, kv, o, oa;                      // attention
    Tensor ckv, cscore;                           // compressor projections (compressed layers)
    Tensor ikv, iscore, iq, iw, topk;             // the lightning indexer (CSA layers)
  };
  BlockActivations AllocateBlockActivations(const BlockWeights& b, const SeqRows& first, int64_t N);
  // Per-token attention inputs: q, kv (normed, roped), the compressors' projections, the indexer's query.
  void AttentionInputs(const BlockWeights& b, const std::vector<int64_t>& positions, BlockActivations* a);
  // The stateful part, one sequence at a time: compressors fold completed windows into entries, the
  // indexer picks its top-k, attention over window + entries, ring updates.
  void AttentionCore(const BlockWeights& b, const std::vector<SeqRows>& seqs, const std::vector<int64_t>& positions,
                     BlockActivations* a);
  void AttentionOutput(const BlockWeights& b, const std::vector<int64_t>& positions, BlockActivations* a);
  // Folds every completed window of the projections kvp/score (score without the position bias, which the
  // step adds) into new entries of each sequence's state (normed, roped at the window's first position) and
  // keeps the pending rows.
  void CompressorUpdate(const CompressorWeights& w, const Tensor& kvp, const Tensor& score, int layer, bool indexer,
                        const std::vector<SeqRows>& seqs);
  // image_rows: one flag per row (bias_vl routing), or empty for a step without images.
  void MoeBlock(const BlockWeights& b, const Tensor& x, const std::vector<int32_t>& tokens,
                const std::vector<uint8_t>& image_rows, Tensor* out);
  // One block (attention and MoE hyper-connection sites) over the residual X [N, hc*D], in place.
  // image_rows: as MoeBlock's (the MTP blocks pass none).
  void RunBlock(const BlockWeights& b, const std::vector<SeqRows>& seqs, const std::vector<int64_t>& positions,
                const std::vector<int32_t>& tokens, Tensor* X, const std::vector<uint8_t>& image_rows = {});
  // hc head, final norm and the vocabulary-split head over Xs [R, hc*D]: host f32 [R, vocab] on every rank.
  // step_rows: the step's row count (the head's segment key; 0 outside Forward).
  Tensor HeadLogits(const Tensor& Xs, const HcWeights& hc_head, const Tensor& norm, int64_t step_rows);
  // The head's logits of this rank's vocabulary rows, left in backend scratch [R, head.out]; with `head` given
  // (the drafts' head), that linear's rows instead.
  Tensor HeadLocalLogits(const Tensor& Xs, const HcWeights& hc_head, const Tensor& norm, int64_t step_rows,
                         const LinearWeight* head = nullptr);
  // The drafts' logits over Xs [R, hc*D]: host f32 [R, vocab] on every rank. With a draft head
  // (SetDraftVocabulary) only ids < draft_rows are computed, by every rank alone (no collective), and the
  // others are -inf, so that the row is the distribution drafts are drawn from; else HeadLogits.
  Tensor DraftHeadLogits(const Tensor& Xs, const HcWeights& hc_head, const Tensor& norm);
  // Whether the ranks' vocabulary slices can be gathered where they are (a device communicator with the
  // device backend, equal slices), so that tensor-parallel steps sample on the device too.
  bool GathersLogitsOnDevice() const;
  // [R, vocab] on the device from every rank's [R, vocab / world] slice (GathersLogitsOnDevice()).
  Tensor GatherLogitsOnDevice(const Tensor& local);
  // Keeps the step's last-block residual rows and tokens of MTP-enabled sequences for Draft; with a vision
  // model also which positions were image rows and their input embeddings, taken from h [N, D] (the step's
  // embedding rows with the image embeddings placed).
  void RecordMtpInput(const Tensor& X, const Tensor& h, const std::vector<SeqRows>& seqs,
                      const std::vector<int32_t>& tokens);
  // RecordMtpInput's image part for one sequence: its image rows at positions >= from into m's image ring.
  void RecordMtpImageRows(const Tensor& h, const SeqRows& s, int64_t from, MtpState* m);
  // An MTP input row whose embedding is a kept image row: row `row` of the rows being built takes the image
  // embedding recorded for position `position` (MtpState::image) instead of the token's table row.
  struct MtpImageInput {
    int64_t row;
    const Tensor* ring;
    int64_t position;
  };
  // The MTP block's input rows: h_proj(hnorm(X) per stream) + e_proj(enorm(e)) on every stream, where e is
  // embed(token), or the recorded image embedding for the rows in `images`.
  // The rows are Scratch of the current step; without image rows and position 0 (whose embedding row is
  // zeroed) they are one graph segment.
  // With `ids` (I32 [N], Scratch) the rows' token ids come from there (Backend::EmbeddingIds) instead of
  // `tokens`, which then only stand in as the step's metadata.
  Tensor MtpInput(const MtpWeights& m, const Tensor& X, const std::vector<int32_t>& tokens,
                  const std::vector<int64_t>& positions, const std::vector<MtpImageInput>& images = {},
                  const Tensor* ids = nullptr);
  // One run of MTP block m over rows of these tokens and positions as a backend step of its own (its segments
  // record and replay like the target's; its temporaries are Scratch): `fill` writes the rows' residual
  // input into X [N, hc*D] (Scratch), MtpInput and the block run on it, and the block's output comes back in
  // backend memory that outlives the step. With `fill_ids` the rows' token ids are written by it into an
  // I32 [N] Scratch on the backend (the draft chain's picks) and `tokens` are placeholders.
  Tensor MtpBlockStep(const MtpWeights& m, const std::vector<SeqRows>& seqs, const std::vector<int64_t>& positions,
                      const std::vector<int32_t>& tokens, const std::vector<MtpImageInput>& images,
                      const std::function<void(Tensor* X)>& fill,
                      const std::function<void(Tensor* ids)>& fill_ids = nullptr);
  // Whether this Draft call's chain keeps its picks on the backend (PickDraftIds): every drafting request
  // greedy without asking for logits, the head's rows whole here, no hash-routed MTP block.
  bool DraftsStayOnBackend(const std::vector<DraftRequest>& batch) const;
  // The head's input rows of a chain link: rows `head_rows` of `prev`, in Scratch of the current step.
  Tensor DraftHeadInputs(const Tensor& prev, const std::vector<int64_t>& head_rows);
  // A chain link on the backend: MTP head m over rows `head_rows` of `prev` and the argmax of each row into
  // ids (I32 [rows], Backend::ArgmaxRows), as a backend step; nothing comes to the host.
  void PickDraftIds(const MtpWeights& m, const Tensor& prev, const std::vector<int64_t>& head_rows, Tensor* ids);
  // A chain link on the host: MTP head m over rows `head_rows` of `prev` (one per request in `requests`) as a
  // backend step, its logits on the host (into each request's logits row `step` where it asked for them),
  // and each request's draft (its `choose`, else the argmax).
  std::vector<int32_t> PickDrafts(const MtpWeights& m, const Tensor& prev, const std::vector<int64_t>& head_rows,
                                  const std::vector<const DraftRequest*>& requests, int step,
                                  const std::vector<DraftResult*>& results);
  void AllReduce(Tensor* t);

  ModelConfig config_;
  ShardSpec shard_;
  ShardLayout layout_;
  std::shared_ptr<Backend> backend_;
  LocalCommunicator local_comm_;
  Communicator* comm_;
  ModelWeights weights_;
  std::string source_dir_;              // where the weights came from (Load), for the draft head
  std::optional<SyntheticSpec> synthetic_;  // or the synthetic spec (LoadSynthetic)
  std::vector<std::vector<float>> inv_freq_;  // per layer
  mutable std::shared_ptr<StatePool> pool_;     // every sequence state's memory (model/state_pool.h)
};

}  // namespace dsmesh

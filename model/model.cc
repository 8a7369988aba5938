// Model / LoadModel: the public API over ModelImpl, plus state creation and memory accounting.
#include "model/model.h"

#include <sys/stat.h>

#include <cmath>
#include <stdexcept>

#include "model/kv_layout.h"
#include "model/model_impl.h"
#include "model/rope.h"
#include "model/testing/synthetic.h"

namespace dsmesh {

ModelImpl::ModelImpl(ModelConfig config, ShardSpec shard, std::shared_ptr<Backend> backend, Communicator* comm)
    : config_(std::move(config)), shard_(shard), backend_(std::move(backend)), comm_(comm ? comm : &local_comm_) {
  layout_ = MakeShardLayout(config_, shard_);
  if (comm_->world() != shard_.world || comm_->rank() != shard_.rank)
    throw std::runtime_error("LoadModel: shard is rank " + std::to_string(shard_.rank) + " of " +
                             std::to_string(shard_.world) + " but the communicator is rank " +
                             std::to_string(comm_->rank()) + " of " + std::to_string(comm_->world()));
  for (int l = 0; l < config_.num_layers + config_.num_mtp_layers; ++l)
    inv_freq_.push_back(LayerInvFreq(config_, l));
}

void ModelImpl::Load(const std::string& dir) {
  Checkpoint ckpt = Checkpoint::Open(dir);
  weights_ = LoadWeights(ckpt, config_, layout_, *backend_);
  source_dir_ = dir;
}

void ModelImpl::LoadSynthetic(const SyntheticSpec& spec) {
  weights_ = LoadSyntheticWeights(spec, config_, layout_, *backend_);
  synthetic_ = spec;
}

int64_t ModelImpl::SetDraftVocabulary(int64_t n) {
  const int64_t V = config_.vocab_size;
  if (n < 0 || n > V)
    throw std::runtime_error("draft_vocab_size " + std::to_string(n) + " is outside 0.." + std::to_string(V) +
                             " (the model's vocabulary; 0: the whole head)");
  // An EXL3 head is decoded in blocks of 128 output rows: the rest of the last block comes for free.
  int64_t rows = weights_.head.is_exl3() ? (n + 127) / 128 * 128 : n;
  if (rows >= V) rows = 0;  // the whole vocabulary: the head itself
  if (rows == weights_.draft_rows) return draft_vocab_size();
  weights_.bytes -= weights_.draft_head_bytes;
  weights_.draft_head = LinearWeight{};
  weights_.draft_rows = 0;
  weights_.draft_head_bytes = 0;
  if (rows == 0) return draft_vocab_size();
  size_t bytes = 0;
  if (synthetic_) {
    weights_.draft_head = LoadSyntheticHeadRows(*synthetic_, config_, *backend_, rows, &bytes);
  } else {
    Checkpoint ckpt = Checkpoint::Open(source_dir_);
    weights_.draft_head = LoadHeadRows(ckpt, config_, *backend_, rows, &bytes);
  }
  weights_.draft_rows = rows;
  weights_.draft_head_bytes = bytes;
  weights_.bytes += bytes;
  return rows;
}

StatePool& ModelImpl::state_pool() const {
  if (!pool_) pool_ = std::make_shared<StatePool>(config_, !weights_.mtp.empty(), StatePoolOptions{}, backend_.get());
  return *pool_;
}

const StatePool& ModelImpl::ConfigureStatePool(const StatePoolOptions& options) {
  if (pool_ && pool_.use_count() > 1)
    throw std::logic_error("ConfigureStatePool: sequence states of the previous pool are still alive");
  pool_.reset();  // the old pool's memory goes back before the new one is taken
  pool_ = std::make_shared<StatePool>(config_, !weights_.mtp.empty(), options, backend_.get());
  return *pool_;
}

std::unique_ptr<SequenceState> ModelImpl::NewState(int k, int slot) const {
  const ModelConfig& c = config_;
  if (k < 0) throw std::runtime_error("NewState: negative number of speculative tokens");
  if (k > 0 && weights_.mtp.empty())
    throw std::runtime_error("speculative decoding (method mtp) needs an MTP block, and this checkpoint has none "
                             "(num_nextn_predict_layers " + std::to_string(c.num_mtp_layers) + ", no mtp.0.* tensors)");
  StatePool& pool = state_pool();
  if (k > pool.max_spare())
    throw std::runtime_error("NewState: " + std::to_string(k) + " speculative tokens, the state pool keeps " +
                             std::to_string(pool.max_spare()) + " rows for rollback");
  if (pool.external() && (slot < 0 || slot >= pool.num_slots()))
    throw std::runtime_error("NewState: state slot " + std::to_string(slot) + " outside the pool's " +
                             std::to_string(pool.num_slots()) + " slots");
  auto d = std::make_unique<SequenceStateData>();
  d->backend = backend_.get();
  d->owner_model = this;
  d->pool = pool_;
  d->slot = pool.external() ? slot : pool.AllocateSlot();
  d->spare = k;
  // With speculation the MTP blocks' layer states follow the main blocks (BlockWeights::layer indexes them).
  const int n_mtp = static_cast<int>(weights_.mtp.size());
  const int layers = c.num_layers + (k > 0 ? n_mtp : 0);
  for (int l = 0; l < layers; ++l) {
    LayerState ls;
    ls.ring = pool.Ring(l, d->slot, c.sliding_window + k);
    backend_->Zero(&ls.ring);
    AttentionKind kind = c.attention_kind(l);
    auto init = [&](CompressorState* cs, int64_t dim, bool overlap, bool indexer) {
      cs->ratio = c.compress_ratio(l);
      cs->overlap = overlap;
      cs->dim = dim;
      const int rows = (overlap ? 2 : 1) * cs->ratio + k;
      cs->pending_kv = pool.Pending(l, indexer, false, d->slot, rows);
      cs->pending_score = pool.Pending(l, indexer, true, d->slot, rows);
      backend_->Zero(&cs->pending_kv);
      backend_->Zero(&cs->pending_score);
    };
    if (kind != AttentionKind::kSliding)
      init(&ls.compressor, c.head_dim, kind == AttentionKind::kCompressedSparse, false);
    if (kind == AttentionKind::kCompressedSparse) init(&ls.indexer, c.index_head_dim, true, true);
    d->layers.push_back(std::move(ls));
  }
  if (k > 0) {
    const int history = n_mtp * c.sliding_window + k;
    d->mtp.hidden = pool.MtpHidden(d->slot, history);
    backend_->Zero(&d->mtp.hidden);
    d->mtp.tokens.assign(history, 0);
    if (c.vision.enabled()) {  // image rows' embeddings for the MTP input (model/mtp.cc)
      d->mtp.is_image.assign(history, 0);
      d->mtp.image = pool.MtpImage(d->slot, history);
      backend_->Zero(&d->mtp.image);
    }
    for (int j = 1; j < n_mtp; ++j) {
      d->mtp.chain.push_back(pool.MtpChain(d->slot, j, c.sliding_window + k));
      backend_->Zero(&d->mtp.chain.back());
    }
  }
  return std::make_unique<SequenceState>(std::move(d));
}

// The forward stores its state in f32 (model/kv_layout.h has the other layouts' costs).
double ModelImpl::StateBytesPerToken() const {
  return ComputeKvLayout(config_, KvCacheDtype::kF32, /*with_mtp=*/false).BytesPerToken();
}

size_t ModelImpl::StateFixedBytes(int k) const {
  const bool mtp = k > 0 && !weights_.mtp.empty();
  return static_cast<size_t>(ComputeKvLayout(config_, KvCacheDtype::kF32, mtp, k).FixedBytesPerSequence());
}

// ---- Model ----

Model::Model(std::unique_ptr<ModelImpl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
const ModelConfig& Model::config() const { return impl_->config(); }
const ShardSpec& Model::shard() const { return impl_->shard(); }
Backend& Model::backend() const { return impl_->backend(); }
const StatePool& Model::ConfigureStatePool(const StatePoolOptions& options) {
  return impl_->ConfigureStatePool(options);
}
const StatePool& Model::state_pool() const { return impl_->state_pool(); }
std::unique_ptr<SequenceState> Model::NewState(int speculative_tokens, int slot) const {
  return impl_->NewState(speculative_tokens, slot);
}
bool Model::has_mtp() const { return !impl_->weights().mtp.empty(); }
std::vector<SequenceOutput> Model::Forward(const std::vector<SequenceStep>& batch) { return impl_->Forward(batch); }
std::vector<DraftResult> Model::Draft(const std::vector<DraftRequest>& batch) { return impl_->Draft(batch); }
int64_t Model::SetDraftVocabulary(int64_t n) { return impl_->SetDraftVocabulary(n); }
int64_t Model::draft_vocab_size() const { return impl_->draft_vocab_size(); }
size_t Model::StateBytesPerToken() const { return static_cast<size_t>(std::ceil(impl_->StateBytesPerToken())); }
size_t Model::StateFixedBytes(int speculative_tokens) const { return impl_->StateFixedBytes(speculative_tokens); }
size_t Model::WeightBytes() const { return impl_->weights().bytes; }
std::string Model::WeightsDescription() const { return DescribeWeights(impl_->weights()); }

std::unique_ptr<Model> LoadModel(const std::string& dir, const ShardSpec& shard, std::shared_ptr<Backend> backend,
                                 Communicator* comm) {
  if (!backend) throw std::runtime_error("LoadModel: no backend given");
  if (IsSyntheticSource(dir)) {
    const SyntheticSpec spec = ParseSyntheticSource(dir);
    auto impl = std::make_unique<ModelImpl>(SyntheticConfig(spec), shard, std::move(backend), comm);
    impl->LoadSynthetic(spec);
    return std::make_unique<Model>(std::move(impl));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw std::runtime_error(dir + ": model directory does not exist");
  if (!backend) throw std::runtime_error("LoadModel: no backend given");
  ModelConfig config = ModelConfig::FromDirectory(dir);
  auto impl = std::make_unique<ModelImpl>(std::move(config), shard, std::move(backend), comm);
  impl->Load(dir);
  return std::make_unique<Model>(std::move(impl));
}

}  // namespace dsmesh

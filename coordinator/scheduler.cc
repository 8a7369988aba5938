#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace dsmesh {

namespace {
constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();
}  // namespace

SchedulingPolicy ParseSchedulingPolicy(const std::string& name) {
  if (name == "fcfs") return SchedulingPolicy::kFcfs;
  if (name == "priority") return SchedulingPolicy::kPriority;
  throw std::invalid_argument("scheduling policy must be fcfs or priority, got '" + name + "'");
}

const char* SchedulingPolicyName(SchedulingPolicy policy) {
  return policy == SchedulingPolicy::kPriority ? "priority" : "fcfs";
}

Scheduler::Scheduler(const SchedulerConfig& config, const KvGeometry& geometry)
    : config_(config),
      blocks_(geometry),
      cache_(geometry.block_size),
      costs_(config.draft_policy),
      mixed_(config.long_prefill_token_threshold > 0 ? config.max_decode_slowdown : 0) {
  spec_.accepted_per_pos.assign(std::max(config_.num_speculative_tokens, 0), 0);
  config_.draft_policy.max_drafts = std::max(config_.num_speculative_tokens, 0);
  costs_ = StepCostModel(config_.draft_policy);
  if (!config_.simulated_acceptance.empty()) {
    if (static_cast<int>(config_.simulated_acceptance.size()) != config_.num_speculative_tokens)
      throw std::invalid_argument("simulated acceptance needs one rate per draft position");
    simulated_.emplace(config_.simulated_acceptance, config_.simulated_acceptance_seed);
  }
}

int64_t Scheduler::max_seq_tokens() const {
  return std::min<int64_t>(config_.max_model_len, geometry().tokens_with_seqs(1));
}

void Scheduler::Validate(const GenerateRequest& req) const {
  const int64_t n = req.prompt_token_ids_size();
  if (n == 0) throw std::invalid_argument("prompt_token_ids is empty");
  for (int32_t t : req.prompt_token_ids())
    if (t < 0 || t >= config_.vocab_size)
      throw std::invalid_argument("prompt token id " + std::to_string(t) + " is outside the vocabulary (size " +
                                  std::to_string(config_.vocab_size) + ")");
  const int64_t max_tokens = req.sampling().max_tokens();
  if (n >= config_.max_model_len || n + max_tokens > config_.max_model_len)
    throw std::invalid_argument("This model's maximum context length is " + std::to_string(config_.max_model_len) +
                                " tokens. However, you requested " + std::to_string(n + max_tokens) + " tokens (" +
                                std::to_string(n) + " in the prompt, " + std::to_string(max_tokens) +
                                " in the completion).");
  const int64_t need = n + std::max<int64_t>(max_tokens, 1);
  const int64_t room = geometry().tokens_with_seqs(1);
  if (need > room)
    throw std::invalid_argument("The KV cache holds at most " + std::to_string(room) +
                                " tokens for one sequence. However, you requested " + std::to_string(need) +
                                " tokens (" + std::to_string(n) + " in the prompt, " + std::to_string(need - n) +
                                " in the completion), so the request could never run; reduce the prompt or "
                                "max_tokens, or give the workers more KV memory (" + geometry().Describe(1) + ")");
  int64_t after = 0;
  for (const PromptImage& im : req.images()) {
    if (im.begin() < after || im.length() < 2 || im.begin() + im.length() > n)
      throw std::invalid_argument("image blocks must be ascending, disjoint and inside the prompt");
    if (im.length() > config_.max_batched_tokens)
      throw std::invalid_argument("an image block of " + std::to_string(im.length()) +
                                  " tokens does not fit one step (--max-num-batched-tokens " +
                                  std::to_string(config_.max_batched_tokens) + "); an image is prefilled in one step");
    after = im.begin() + im.length();
  }
  if (req.priority() != 0 && config_.policy != SchedulingPolicy::kPriority)
    throw std::invalid_argument("Got priority " + std::to_string(req.priority()) +
                                " but Priority scheduling is not enabled (the coordinator runs "
                                "--scheduling-policy fcfs).");
}

int32_t Scheduler::InternImage(const PromptImage& im) {
  std::string content;
  const int32_t grid[2] = {im.vit_h(), im.vit_w()};
  content.append(reinterpret_cast<const char*>(grid), sizeof(grid));
  content.append(reinterpret_cast<const char*>(im.perm().data()), im.perm_size() * sizeof(int32_t));
  content.append(im.patches());
  auto it = interned_images_.find(content);
  if (it == interned_images_.end()) {
    if (interned_images_.size() >= kInternedImages) {
      auto oldest = interned_images_.begin();
      for (auto i = interned_images_.begin(); i != interned_images_.end(); ++i)
        if (i->second.second < oldest->second.second) oldest = i;
      interned_images_.erase(oldest);
    }
    it = interned_images_.emplace(std::move(content), std::make_pair(next_image_id_++, uint64_t{0})).first;
  }
  it->second.second = ++image_clock_;
  return it->second.first;
}

std::vector<int32_t> Scheduler::CacheKey(Request& r) {
  if (r.images.empty()) return r.tokens;
  if (r.image_ids.empty())
    for (const PromptImage& im : r.images) r.image_ids.push_back(InternImage(im));
  std::vector<int32_t> key = r.tokens;
  for (size_t i = 0; i < r.images.size(); ++i) key[r.images[i].begin()] = -1 - r.image_ids[i];
  return key;
}

bool Scheduler::InsideImage(const Request& r, int64_t p) {
  for (const PromptImage& im : r.images)
    if (p > im.begin() && p < im.begin() + im.length()) return true;
  return false;
}

void Scheduler::Add(std::shared_ptr<Request> r) {
  r->phase = Request::Phase::kWaiting;
  r->arrival_seq = next_arrival_++;
  r->arrival_step = steps_;
  if (config_.policy != SchedulingPolicy::kPriority) r->priority = 0;
  Enqueue(std::move(r));
}

bool Scheduler::RanksBefore(const Request& a, const Request& b) const {
  if (a.priority != b.priority) return a.priority < b.priority;
  return a.arrival_seq < b.arrival_seq;
}

void Scheduler::Enqueue(std::shared_ptr<Request> r) {
  auto at = std::upper_bound(waiting_.begin(), waiting_.end(), r,
                             [this](const auto& x, const auto& y) { return RanksBefore(*x, *y); });
  waiting_.insert(at, std::move(r));
}

void Scheduler::AddRunning(std::shared_ptr<Request> r) {
  auto at = std::upper_bound(running_.begin(), running_.end(), r,
                             [this](const auto& x, const auto& y) { return RanksBefore(*x, *y); });
  running_.insert(at, std::move(r));
}

bool Scheduler::HasWork() const {
  return !running_.empty() || !waiting_.empty() || !pending_frees_.empty() || !pending_drops_.empty();
}

double Scheduler::kv_usage() const {
  // Blocks held by running sequences (snapshots' blocks count only while a running sequence shares them).
  std::vector<uint64_t> owners;
  for (const auto& r : running_) owners.push_back(r->seq_id);
  const int64_t used = blocks_.BlocksOf(owners);
  return geometry().num_blocks ? double(used) / geometry().num_blocks : 0.0;
}

bool Scheduler::Reserve(uint64_t owner, int64_t tokens, const std::set<uint64_t>& pinned) {
  return EvictUntil([&] { return blocks_.Grow(owner, tokens); }, pinned);
}

bool Scheduler::EvictUntil(const std::function<bool()>& fits, const std::set<uint64_t>& pinned) {
  while (!fits()) {
    auto victim = cache_.EvictLru(pinned);
    if (!victim) return false;
    blocks_.Release(*victim);
    pending_drops_.push_back(*victim);
  }
  return true;
}

void Scheduler::Preempt(std::shared_ptr<Request> r) {
  running_.erase(std::find(running_.begin(), running_.end(), r));
  blocks_.Release(r->seq_id);
  pending_frees_.push_back(r->seq_id);
  r->phase = Request::Phase::kWaiting;
  r->computed = 0;
  r->drafts.clear();
  ++preemptions_;
  Enqueue(std::move(r));
}

void Scheduler::Finish(const std::shared_ptr<Request>& r, FinishReason reason, const std::string& error,
                       GenerateResponse* response) {
  if (r->phase == Request::Phase::kRunning) {
    blocks_.Release(r->seq_id);
    pending_frees_.push_back(r->seq_id);
    running_.erase(std::find(running_.begin(), running_.end(), r));
  }
  r->phase = Request::Phase::kFinished;
  GenerateResponse local;
  GenerateResponse* resp = response ? response : &local;
  resp->set_request_id(r->request_id);
  resp->set_finish_reason(reason);
  if (!error.empty()) resp->set_error(error);
  resp->set_prompt_tokens(r->prompt_len);
  resp->set_completion_tokens(r->num_generated());
  if (!response) r->out->Push(std::move(local));
}

SequencePlan* Scheduler::AddChunk(StepPlan* plan, Request& r, int64_t n, const std::set<uint64_t>& pinned) {
  SequencePlan* sp = plan->add_seqs();
  sp->set_seq_id(r.seq_id);
  sp->set_start_pos(r.computed);
  sp->mutable_tokens()->Add(r.tokens.begin() + r.computed, r.tokens.begin() + r.computed + n);
  sp->set_sample(r.computed + n == static_cast<int64_t>(r.tokens.size()));
  sp->set_return_logits(r.return_logits);
  sp->mutable_block_table()->Add(blocks_.table(r.seq_id).begin(), blocks_.table(r.seq_id).end());
  if (r.first_chunk) {
    sp->set_is_new(true);
    sp->set_state_slot(blocks_.slot(r.seq_id));
    sp->set_restore_snapshot(r.restore_snapshot);
    sp->set_prompt_len(r.prompt_len);
    const int64_t history = std::max<int64_t>(r.prompt_len, r.computed);
    sp->mutable_prompt_tokens()->Add(r.tokens.begin(), r.tokens.begin() + history);
    *sp->mutable_sampling() = r.params;
    sp->set_seed(r.seed);
    sp->set_num_speculative_tokens(config_.num_speculative_tokens);
    r.first_chunk = false;
  }
  for (const PromptImage& im : r.images)
    if (im.begin() >= r.computed && im.begin() + im.length() <= r.computed + n) *sp->add_images() = im;
  if (r.snapshot_at > 0 && r.computed + n == r.snapshot_at) {
    const uint64_t id = next_id_++;
    // The snapshot shares the sequence's blocks up to the boundary (neither writes them again) and
    // takes a slot for its copy of the fixed part.
    const int64_t shared = r.snapshot_at / geometry().block_size;
    if (EvictUntil([&] { return blocks_.Share(id, r.seq_id, shared); }, pinned)) {
      sp->set_snapshot_after(id);
      sp->set_snapshot_slot(blocks_.slot(id));
      sp->mutable_snapshot_blocks()->Add(blocks_.table(id).begin(), blocks_.table(id).end());
      std::vector<int32_t> key = CacheKey(r);
      key.resize(r.snapshot_at);
      pending_snapshots_.push_back({id, std::move(key), r.snapshot_at});
    }
    r.snapshot_at = 0;
  }
  return sp;
}

void Scheduler::FinishCancelled() {
  for (size_t i = 0; i < running_.size();) {
    auto r = running_[i];
    if (r->cancelled.load()) {
      Finish(r, FINISH_ABORT, "cancelled", nullptr);
    } else {
      ++i;
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->cancelled.load()) {
      auto r = *it;
      it = waiting_.erase(it);
      Finish(r, FINISH_ABORT, "cancelled", nullptr);
    } else {
      ++it;
    }
  }
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  FinishCancelled();  // their blocks come back before anything is allocated
  const bool fair = config_.long_prefill_token_threshold > 0;
  const bool alone = running_.size() + waiting_.size() == 1;
  const int64_t cap = fair && !alone ? config_.long_prefill_token_threshold : kNoCap;
  int64_t budget = config_.max_batched_tokens;
  // A request that returns logits (prompt_logprobs, the logits oracle) gets a vocab-wide f32 row back for
  // every planned token. The rows travel in the step result on the worker's stream, which also carries
  // its heartbeats: one step's rows stay within kMaxLogitsBytesPerStep so a long prefill chunk cannot
  // stall that stream past the heartbeat timeout.
  auto cap_logits_rows = [this](const Request& r, int64_t n) {
    if (!r.return_logits || config_.vocab_size <= 0) return n;
    return std::min<int64_t>(n, std::max<int64_t>(1, kMaxLogitsBytesPerStep / (4 * config_.vocab_size)));
  };
  auto cut_at_snapshot = [](const Request& r, int64_t n) {
    return r.snapshot_at > r.computed ? std::min<int64_t>(n, r.snapshot_at - r.computed) : n;
  };
  // An image block is prefilled in one step (its span attends both ways, docs/vision.md): a chunk that
  // would end inside a block ends before it; one that starts at a block covers the whole block, even past
  // the budget when `grow` (Validate keeps every block within max_batched_tokens).
  auto image_safe = [](const Request& r, int64_t n, bool grow) {
    const int64_t start = r.computed, end = start + n;
    for (const PromptImage& im : r.images) {
      const int64_t b = im.begin(), e = im.begin() + im.length();
      if (end > b && end < e) return b > start ? b - start : (grow ? e - start : 0);
    }
    return n;
  };

  // Running requests, best rank first, grow their blocks. The fair order gives decodes their row now and
  // prefills an upper bound (their share is what admission leaves); the vLLM order spends the budget here.
  struct Chunk {
    std::shared_ptr<Request> r;
    int64_t n;
    int64_t drafts = 0;
  };
  std::vector<Chunk> decodes, prefills;
  int64_t decode_rows = 0;
  for (const auto& r : running_) decode_rows += static_cast<int64_t>(r->tokens.size()) - r->computed == 1;
  const int64_t prefill_bound = std::max<int64_t>(0, budget - decode_rows);
  int64_t decode_used = 0;  // the fair order's decode rows (newest tokens and drafts) so far
  bool preempted = false;
  for (size_t i = 0; i < running_.size();) {
    auto r = running_[i];
    const int64_t remaining = static_cast<int64_t>(r->tokens.size()) - r->computed;
    const bool decode = remaining == 1;
    int64_t n;
    if (!fair) {
      n = std::min(remaining, budget);
    } else if (decode) {
      n = decode_used < budget ? 1 : 0;
    } else {
      n = std::min({remaining, cap, prefill_bound});
    }
    n = image_safe(*r, cap_logits_rows(*r, cut_at_snapshot(*r, n)), /*grow=*/!fair || !decode);
    if (n <= 0) {
      ++i;
      continue;
    }
    // Drafts ride after the newest token; they must fit the budget, the context and max_tokens (a step
    // yields at most drafts + 1 tokens).
    int64_t drafts = 0;
    if (decode && n == 1) {
      const int64_t room = (fair ? budget - decode_used : budget) - 1;
      drafts = std::min<int64_t>({static_cast<int64_t>(r->drafts.size()), room,
                                  config_.max_model_len - static_cast<int64_t>(r->tokens.size()) - 1,
                                  static_cast<int64_t>(r->max_tokens) - r->num_generated() - 1});
      drafts = std::max<int64_t>(drafts, 0);
    }
    // Victims come from the back (the worst rank): never a request already planned in this loop.
    bool preempted_self = false;
    while (!Reserve(r->seq_id, r->computed + n + drafts, {})) {
      auto victim = running_.back();
      Preempt(victim);
      preempted = true;
      if (victim == r) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;  // r ranked last; everything after it is gone too
    if (!fair) {
      budget -= n + drafts;
    } else if (decode) {
      decode_used += n + drafts;
    }
    (decode ? decodes : prefills).push_back({r, n, drafts});
    ++i;
  }
  if (fair) budget -= decode_used;
  // Beside decoding sequences the prefill tokens are also bounded by time (max_decode_slowdown). The cap
  // counts as taken when the prefills then use all of it (a smaller per-request cap may leave it unused).
  const int64_t mixed_cap = fair && decode_used > 0 ? mixed_.Cap() : kNoCap;
  const bool time_capped = mixed_cap < budget;
  if (time_capped) budget = mixed_cap;

  // First chunks of waiting requests, in rank order.
  std::set<uint64_t> pinned;  // snapshots this plan restores from
  std::vector<Chunk> admitted;
  while (!preempted && !waiting_.empty() && static_cast<int>(running_.size()) < config_.max_num_seqs &&
         budget > 0) {
    auto r = waiting_.front();
    const int64_t total = static_cast<int64_t>(r->tokens.size());
    const bool cacheable = config_.prefix_caching && !r->return_logits;
    int64_t start = 0;
    uint64_t restore = 0;
    std::vector<int32_t> key;
    if (cacheable) {
      key = CacheKey(*r);
      for (int64_t max_len = total - 1; max_len > 0;) {
        auto hit = cache_.Lookup(key, max_len);
        if (!hit) break;
        if (!InsideImage(*r, hit->tokens)) {
          start = hit->tokens;
          restore = hit->snapshot_id;
          break;
        }
        max_len = hit->tokens - 1;  // a shorter snapshot, ending before that picture
      }
    }
    int64_t snapshot_at = 0;
    if (cacheable) {
      const int64_t b = (total - 1) / geometry().block_size * geometry().block_size;
      if (b > start && !InsideImage(*r, b) && !cache_.Contains(key, b)) snapshot_at = b;
    }
    int64_t n = cap_logits_rows(*r, std::min({total - start, budget, cap}));
    if (snapshot_at > 0) n = std::min<int64_t>(n, snapshot_at - start);
    r->computed = start;  // (image_safe reads it; set again below once admitted)
    n = image_safe(*r, n, /*grow=*/true);
    const uint64_t seq_id = next_id_++;
    std::set<uint64_t> pinned_with = pinned;
    if (restore) pinned_with.insert(restore);
    // A restored sequence starts with the snapshot's blocks (shared) and its own from there.
    const bool reserved =
        EvictUntil([&] { return !restore || blocks_.Share(seq_id, restore, start / geometry().block_size); },
                   pinned_with) &&
        Reserve(seq_id, start + n, pinned_with);
    if (!reserved) {  // the best-ranked waits for blocks; the rest behind it
      blocks_.Release(seq_id);
      break;
    }
    pinned = std::move(pinned_with);
    waiting_.pop_front();
    if (cacheable) {
      cache_.queries += total;
      cache_.hits += start;
    }
    r->phase = Request::Phase::kRunning;
    r->seq_id = seq_id;
    r->computed = start;
    r->first_chunk = true;
    r->restore_snapshot = restore;
    r->snapshot_at = snapshot_at;
    r->cached_tokens = start;
    AddRunning(r);
    admitted.push_back({r, n});
    budget -= n;
  }

  std::vector<std::pair<Request*, SequencePlan*>> sampled;  // chunks that end at the newest token
  for (const auto& c : decodes) {
    SequencePlan* sp = AddChunk(&plan, *c.r, c.n, pinned);
    sp->mutable_draft_tokens()->Add(c.r->drafts.begin(), c.r->drafts.begin() + c.drafts);
    if (simulated_ && c.drafts > 0)
      sp->mutable_simulated_acceptance()->set_accepted_drafts(simulated_->Draw(static_cast<int>(c.drafts)));
    sampled.push_back({c.r.get(), sp});
  }
  for (const auto& c : admitted) sampled.push_back({c.r.get(), AddChunk(&plan, *c.r, c.n, pinned)});
  for (auto& c : prefills) {
    if (fair) {
      c.n = image_safe(*c.r, std::min(c.n, budget), /*grow=*/false);
      budget -= c.n;
    }
    if (c.n > 0) sampled.push_back({c.r.get(), AddChunk(&plan, *c.r, c.n, pinned)});
  }
  if (time_capped && budget == 0) {
    ++mixed_caps_;
    if (!logged_mixed_cap_)
      std::fprintf(stderr, "[coordinator] prefill beside decoding sequences: %lld tokens per step (decode-only step "
                           "%.2f ms, %.3f ms per prefill token, --max-decode-slowdown %.2g; logged once)\n",
                   static_cast<long long>(mixed_cap), mixed_.decode_step_seconds() * 1e3,
                   mixed_.prefill_token_seconds() * 1e3, config_.max_decode_slowdown);
    logged_mixed_cap_ = true;
  }
  // The draft policy decides for every sequence that samples this step how many drafts follow it.
  // Sequences that return logprobs or logits do not speculate (the worker drafts nothing for them).
  if (config_.num_speculative_tokens > 0) {
    std::erase_if(sampled, [](const auto& e) {
      return !e.second->sample() || e.first->return_logits || e.first->params.want_logprobs() ||
             e.first->params.logprobs() > 0;
    });
    int drafting = 0;  // sequences whose last decision proposed drafts: they share the draft passes
    for (auto& [r, sp] : sampled) {
      if (!r->draft_policy) r->draft_policy.emplace(config_.draft_policy);
      drafting += r->draft_policy->current() > 0;
    }
    for (auto& [r, sp] : sampled) {
      DraftDecision decision = DraftDecision::kFull;
      const int others = drafting - (r->draft_policy->current() > 0 ? 1 : 0);
      const int k = config_.draft_policy.adaptive
                        ? r->draft_policy->Decide(costs_, static_cast<int>(sampled.size()), others + 1, &decision)
                        : config_.num_speculative_tokens;
      ++spec_.decisions[static_cast<int>(decision)];
      sp->set_drafts_withheld(config_.num_speculative_tokens - k);
    }
  }

  for (uint64_t id : pending_frees_) plan.add_free_seqs(id);
  for (uint64_t id : pending_drops_) plan.add_drop_snapshots(id);
  pending_frees_.clear();
  pending_drops_.clear();
  if (plan.seqs_size() > 0) ++steps_;
  return plan;
}

void Scheduler::Apply(const StepPlan& plan, const StepResult& result) {
  std::unordered_map<uint64_t, const SequenceResult*> by_id;
  for (const auto& s : result.seqs()) by_id[s.seq_id()] = &s;
  std::unordered_map<uint64_t, std::shared_ptr<Request>> running;
  for (const auto& r : running_) running[r->seq_id] = r;

  for (const auto& sp : plan.seqs()) {
    auto it = running.find(sp.seq_id());
    if (it == running.end()) continue;  // preempted or cancelled meanwhile
    auto r = it->second;
    r->computed += sp.tokens_size();
    auto res = by_id.find(sp.seq_id());
    GenerateResponse resp;
    resp.set_request_id(r->request_id);
    if (res != by_id.end()) {
      for (const auto& row : res->second->logits()) *resp.add_logits() = row;
    }
    FinishReason finish = FINISH_NONE;
    if (sp.sample()) {
      if (res == by_id.end() || res->second->token_id() < 0) {
        Finish(r, FINISH_ABORT, "internal error: rank 0 returned no token for sequence " + std::to_string(sp.seq_id()),
               nullptr);
        continue;
      }
      const SequenceResult& sr = *res->second;
      std::vector<int32_t> produced(sr.token_ids().begin(), sr.token_ids().end());
      if (produced.empty()) produced.push_back(sr.token_id());
      const int accepted = sr.num_accepted_drafts();
      r->computed += accepted;  // the accepted drafts are in the worker state now
      if (sp.draft_tokens_size() > 0) {
        ++spec_.num_drafts;
        spec_.num_draft_tokens += sp.draft_tokens_size();
        spec_.num_accepted_tokens += accepted;
        for (int p = 0; p < accepted && p < static_cast<int>(spec_.accepted_per_pos.size()); ++p)
          ++spec_.accepted_per_pos[p];
        resp.set_num_draft_tokens(sp.draft_tokens_size());
        resp.set_num_accepted_tokens(accepted);
        if (r->draft_policy) r->draft_policy->ObserveVerification(sp.draft_tokens_size(), accepted);
      }
      r->drafts.assign(sr.next_drafts().begin(), sr.next_drafts().end());
      if (sr.has_logprobs()) *resp.add_logprobs() = sr.logprobs();
      // In order; the first token that meets a stop condition ends the sequence, later ones are dropped.
      const auto& stops = r->params.stop_token_ids();
      for (int32_t token : produced) {
        r->tokens.push_back(token);
        resp.add_token_ids(token);
        if ((token == config_.eos_token_id && !r->params.ignore_eos()) ||
            std::find(stops.begin(), stops.end(), token) != stops.end()) {
          finish = FINISH_STOP;
        } else if (r->num_generated() >= r->max_tokens ||
                   static_cast<int64_t>(r->tokens.size()) >= config_.max_model_len) {
          finish = FINISH_LENGTH;
        }
        if (finish != FINISH_NONE) break;
      }
    }
    if (resp.token_ids_size() == 0 && resp.logits_size() == 0) continue;
    if (!r->reported_first) {
      r->reported_first = true;
      resp.set_queue_time_s(std::chrono::duration<double>(std::chrono::steady_clock::now() - r->arrival).count());
      resp.set_cached_prompt_tokens(static_cast<int32_t>(r->cached_tokens));
      resp.set_first_token_steps(static_cast<int32_t>(steps_ - r->arrival_step));
      resp.set_first_token_step(steps_);  // Apply follows the Schedule that counted this step
    }
    resp.set_prompt_tokens(r->prompt_len);
    resp.set_completion_tokens(r->num_generated());
    if (finish != FINISH_NONE) {
      Finish(r, finish, "", &resp);
    }
    r->out->Push(std::move(resp));
  }
  for (auto& s : pending_snapshots_) cache_.Insert(s.id, s.tokens, s.len);
  pending_snapshots_.clear();
}

void Scheduler::ObserveStepCost(const StepPlan& plan, const StepResult& result, double wall_seconds) {
  if (plan.seqs_size() == 0) return;
  if (mixed_.on()) {
    int64_t decode_rows = 0, prefill_tokens = 0;
    for (const auto& sp : plan.seqs()) {
      if (!sp.is_new() && sp.sample() && sp.tokens_size() == 1) {
        decode_rows += 1 + sp.draft_tokens_size();
      } else {
        prefill_tokens += sp.tokens_size();
      }
    }
    // (drafting is not the prefill's: it runs after the step's forward whether or not a prefill rode along)
    mixed_.Observe(decode_rows, prefill_tokens, wall_seconds - result.draft_seconds());
  }
  if (config_.num_speculative_tokens <= 0) return;
  int passes = 0;  // Model::Draft chains as many passes as the most drafts asked of it
  for (const auto& sr : result.seqs()) passes = std::max(passes, sr.next_drafts_size());
  spec_.draft_passes += passes;
  spec_.draft_seconds += result.draft_seconds();
  int64_t rows = 0;
  for (const auto& sp : plan.seqs()) {
    if (sp.is_new() || !sp.sample() || sp.tokens_size() != 1) {  // a prefill chunk rode along
      costs_.ObserveDrafts(passes, result.draft_seconds());
      return;
    }
    rows += 1 + sp.draft_tokens_size();
  }
  costs_.Observe(rows, wall_seconds - result.draft_seconds(), passes, result.draft_seconds());
}

void Scheduler::FailAll(const std::string& error) {
  auto running = running_;
  for (auto& r : running) Finish(r, FINISH_ABORT, error, nullptr);
  while (!waiting_.empty()) {
    auto r = waiting_.front();
    waiting_.pop_front();
    Finish(r, FINISH_ABORT, error, nullptr);
  }
  pending_frees_.clear();
  pending_drops_.clear();
  pending_snapshots_.clear();
  Reconfigure(geometry());
}

void Scheduler::Reconfigure(const KvGeometry& geometry) {
  if (!running_.empty() || !waiting_.empty()) throw std::logic_error("Scheduler::Reconfigure with live requests");
  const int64_t queries = cache_.queries, hits = cache_.hits;
  blocks_ = KvBlocks(geometry);
  cache_ = PrefixCache(geometry.block_size);
  cache_.queries = queries;
  cache_.hits = hits;
  pending_frees_.clear();
  pending_drops_.clear();
  pending_snapshots_.clear();
}

}  // namespace dsmesh

// The MTP block (docs/model-v4.md section 5.1; DeepSeek's reference MTPBlock) and greedy drafting (5.2),
// written against the Backend interface like the main forward. The block's row for position t is
// (X_t, token t+1): X0 = h_proj(hnorm(X_t)) on each residual stream + e_proj(enorm(embed(token t+1))) on
// every stream (the embedding row is zeroed at position 0, as vLLM does; where token t+1 was an image row,
// the image embedding the target was fed there stands in for embed(token t+1), as vLLM feeds its drafter
// the target's merged input embeddings: docs/vision.md), then one sliding-window block with its own
// window ring and MoE, then its own hc head and norm and the shared lm_head (or, with SetDraftVocabulary, the
// head's first rows only: the drafts' vocabulary, every other id's logit -inf). Each draft is the argmax of
// its logits or what the request's `choose` picks (sampled drafts).
//
// Every block run and every link of the draft chain is a backend step of its own (BackendStep): its rows'
// tokens and positions are the step's metadata and its temporaries Scratch, so on a device backend the
// block's segments replay recorded graphs as the target's do, and greedy drafts are picked where the logits
// are (only the token ids come back). What crosses steps (a block's outputs, the chain's last rows) is
// copied into backend memory that outlives the step.
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

#include "kernels/cpu/argmax.h"
#include "model/model_impl.h"

namespace dsmesh {

Tensor ModelImpl::MtpInput(const MtpWeights& m, const Tensor& X, const std::vector<int32_t>& tokens,
                           const std::vector<int64_t>& positions, const std::vector<MtpImageInput>& images,
                           const Tensor* ids) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size, N = X.shape[0];
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor e = be.Scratch(DType::kF32, {N, D});
  Tensor ep = be.Scratch(DType::kF32, {N, D});
  Tensor hs = be.Scratch(DType::kF32, {N * hc, D});  // one row per (token, stream)
  Tensor hp = be.Scratch(DType::kF32, {N * hc, D});
  Tensor eb = be.Scratch(DType::kF32, {N, hc * D});
  const bool zero_row = std::find(positions.begin(), positions.end(), 0) != positions.end();
  auto ops = [&] {
    if (ids) {
      be.EmbeddingIds(weights_.embed, *ids, &e);
    } else {
      be.Embedding(weights_.embed, tokens.data(), N, &e);
    }
    // An image row's input is its image embedding, as in the target's embedding rows (PlaceImageEmbeddings).
    for (const MtpImageInput& im : images) RingGet(be, *im.ring, im.position, 1, &e, im.row);
    for (int64_t r = 0; r < N; ++r)
      if (positions[r] == 0) {
        Tensor row = RowView(e, r, 1);
        be.Scale(&row, 0.0f);
      }
    be.RmsNorm(e, D, &m.enorm, eps, &e);
    be.Linear(e, m.e_proj, &ep);
    Tensor hs_rows = hs;
    hs_rows.shape = {N, hc * D};
    be.CopyRows(X, 0, &hs_rows, 0, N);
    be.RmsNorm(hs, D, &m.hnorm, eps, &hs);
    be.Linear(hs, m.h_proj, &hp);
    be.HcExpand(ep, hc, &eb);
    Tensor sum = hp;
    sum.shape = {N, hc * D};
    be.Add(eb, &sum);
  };
  // Which rows are images or at position 0 changes the launches, and a key holds only shapes.
  if (images.empty() && !zero_row) {
    be.Segment({kMtpInputSite, m.block.layer, N, ids ? 1 : 0}, ops);
  } else {
    ops();
  }
  hp.shape = {N, hc * D};
  return hp;
}

Tensor ModelImpl::MtpBlockStep(const MtpWeights& m, const std::vector<SeqRows>& seqs, const std::vector<int64_t>& positions,
                               const std::vector<int32_t>& tokens, const std::vector<MtpImageInput>& images,
                               const std::function<void(Tensor* X)>& fill, const std::function<void(Tensor* ids)>& fill_ids) {
  Backend& be = *backend_;
  const int64_t N = static_cast<int64_t>(positions.size()), W = config_.hc_mult * config_.hidden_size;
  Tensor out = be.Alloc(DType::kF32, {N, W});
  const BackendStep step(be, tokens, positions);
  // Every run of N rows takes the same Scratch in the same order (the ids too, used or not), so its
  // segments meet the offsets they were recorded at whichever phase (window catch-up or draft chain) runs them.
  Tensor X = be.Scratch(DType::kF32, {N, W});
  Tensor ids = be.Scratch(DType::kI32, {N});
  fill(&X);
  if (fill_ids) fill_ids(&ids);
  Tensor y = MtpInput(m, X, tokens, positions, images, fill_ids ? &ids : nullptr);
  RunBlock(m.block, seqs, positions, tokens, &y);
  be.CopyRows(y, 0, &out, 0, N);
  return out;
}

bool ModelImpl::DraftsStayOnBackend(const std::vector<DraftRequest>& batch) const {
  // The chain's token ids feed only the embedding (EmbeddingIds); a hash-routed MTP block would need them
  // on the host.
  for (const MtpWeights& m : weights_.mtp)
    if (config_.mlp_kind(m.block.layer) == MlpKind::kHashMoe) return false;
  // The head's rows whole on this rank (a draft head, one rank) or gathered on the device.
  if (weights_.draft_rows == 0 && comm_->world() > 1 && !GathersLogitsOnDevice()) return false;
  return std::none_of(batch.begin(), batch.end(),
                      [](const DraftRequest& q) { return q.num_drafts > 0 && (q.choose || q.want_logits); });
}

Tensor ModelImpl::DraftHeadInputs(const Tensor& prev, const std::vector<int64_t>& head_rows) {
  Backend& be = *backend_;
  const int64_t A = static_cast<int64_t>(head_rows.size());
  Tensor heads = be.Scratch(DType::kF32, {A, config_.hc_mult * config_.hidden_size});
  std::vector<Backend::RowCopy> copies;
  for (int64_t a = 0; a < A; ++a) copies.push_back({&prev, head_rows[a], &heads, a, 1});
  be.CopyRowsBatch(copies);
  return heads;
}

void ModelImpl::PickDraftIds(const MtpWeights& m, const Tensor& prev, const std::vector<int64_t>& head_rows, Tensor* ids) {
  Backend& be = *backend_;
  const BackendStep scope(be);
  const Tensor heads = DraftHeadInputs(prev, head_rows);
  Tensor lv = HeadLocalLogits(heads, m.hc_head, m.norm, /*step_rows=*/0,
                              weights_.draft_rows > 0 ? &weights_.draft_head : nullptr);
  if (weights_.draft_rows == 0 && comm_->world() > 1) lv = GatherLogitsOnDevice(lv);
  Phase phase(be, "draft picks");
  be.ArgmaxRows(lv, ids);
}

std::vector<int32_t> ModelImpl::PickDrafts(const MtpWeights& m, const Tensor& prev, const std::vector<int64_t>& head_rows,
                                           const std::vector<const DraftRequest*>& requests, int step,
                                           const std::vector<DraftResult*>& results) {
  const int64_t A = static_cast<int64_t>(head_rows.size()), V = config_.vocab_size;
  const BackendStep scope(*backend_);
  const Tensor heads = DraftHeadInputs(prev, head_rows);
  const int64_t draft_vocab = draft_vocab_size();  // logits of ids past it are -inf (DraftHeadLogits)
  Tensor logits = DraftHeadLogits(heads, m.hc_head, m.norm);
  std::vector<int32_t> picks(A);
  for (int64_t a = 0; a < A; ++a) {
    const float* row = logits.as<float>() + a * V;
    if (requests[a]->want_logits) std::copy(row, row + V, results[a]->logits.as<float>() + step * V);
    picks[a] = requests[a]->choose ? requests[a]->choose(step, row) : Argmax(row, draft_vocab);
  }
  return picks;
}

std::vector<DraftResult> ModelImpl::Draft(const std::vector<DraftRequest>& batch) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const int64_t window = c.sliding_window;
  if (weights_.mtp.empty()) throw std::runtime_error("Draft: the model has no MTP block");
  const int n = static_cast<int>(weights_.mtp.size());

  std::set<const SequenceState*> seen;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftRequest& q = batch[i];
    const std::string where = "Draft: batch entry " + std::to_string(i);
    if (!q.state || q.state->data().owner_model != this) throw std::runtime_error(where + " has no state of this model");
    if (!seen.insert(q.state).second) throw std::runtime_error(where + " repeats a state");
    if (!q.state->data().mtp.enabled()) throw std::runtime_error(where + ": the state was made without speculation");
    if (q.next_token >= V) throw std::runtime_error(where + ": token id " + std::to_string(q.next_token) + " is outside the vocabulary");
    if (q.num_drafts < 0 || q.num_drafts > q.state->data().spare + 1 || (q.num_drafts > 0 && q.next_token < 0) ||
        (q.num_drafts > 0 && q.state->data().length == 0))
      throw std::runtime_error(where + ": " + std::to_string(q.num_drafts) + " drafts not possible here");
  }

  // Step 1: every block's catch-up rows up to `last`, the row drafts chain from. Block j's row for position
  // t is (block j-1's output for t-1, token t+1) (block 0: the target's X_t): the depth-(j+1) module of
  // DeepSeek's MTP, one position on as vLLM's chain counts positions. Only the last window of block n-1
  // matters; its inputs need block n-2's window before them, and so on: block j goes back (n-j) windows.
  struct Work {
    size_t entry;
    SequenceStateData* st;
    int64_t last;
  };
  std::vector<Work> work;
  std::vector<int64_t> work_of(batch.size(), -1);
  for (size_t i = 0; i < batch.size(); ++i) {
    SequenceStateData& st = batch[i].state->data();
    const int64_t last = batch[i].next_token >= 0 ? st.length - 1 : st.length - 2;
    if (last < 0 || (st.mtp.length > last && batch[i].num_drafts == 0)) continue;
    work_of[i] = static_cast<int64_t>(work.size());
    work.push_back({i, &st, last});
  }
  if (work.empty()) return std::vector<DraftResult>(batch.size());

  std::vector<Tensor> outs(n);                                  // block j's outputs of this call
  std::vector<std::vector<SeqRows>> rows(n);                    // where each sequence's rows sit in outs[j]
  for (int j = 0; j < n; ++j) {
    const MtpWeights& m = weights_.mtp[j];
    std::vector<SeqRows>& seqs = rows[j];
    std::vector<int64_t> positions;
    std::vector<int32_t> tokens;
    std::vector<MtpImageInput> images;  // rows fed a kept image row instead of a token embedding
    for (const Work& w : work) {
      const int64_t lo = w.last + 1 - (n - j) * window;
      // A row already consumed is recomputed when it is the last one (same inputs, same ring row).
      const int64_t t0 = std::max<int64_t>(std::min(std::max(w.st->mtp.length, lo), w.last), 0);
      seqs.push_back({w.st, static_cast<int64_t>(positions.size()), w.last - t0 + 1, t0});
      const int64_t slots = w.st->mtp.hidden.shape[0];
      const MtpState& ms = w.st->mtp;
      for (int64_t t = t0; t <= w.last; ++t) {
        const bool stored = t + 1 < w.st->length;  // else token t+1 is the request's next_token
        if (stored && !ms.is_image.empty() && ms.is_image[(t + 1) % slots])
          images.push_back({static_cast<int64_t>(positions.size()), &ms.image, t + 1});
        positions.push_back(t);
        tokens.push_back(stored ? ms.tokens[(t + 1) % slots] : batch[w.entry].next_token);
      }
    }
    outs[j] = MtpBlockStep(m, seqs, positions, tokens, images, [&](Tensor* X) {
      for (size_t k = 0; k < work.size(); ++k) {
        const SeqRows& s = seqs[k];
        if (j == 0) {
          RingGet(be, s.state->mtp.hidden, s.start, s.count, X, s.offset);
          continue;
        }
        // Block j-1's outputs of this call where it computed position t-1, its kept history before that.
        const SeqRows& p = rows[j - 1][k];
        for (int64_t t = s.start; t <= std::min(p.start, work[k].last); ++t) {
          if (t == 0) {  // no output before position 0: a zero residual
            Tensor row = RowView(*X, s.offset + (t - s.start), 1);
            be.Zero(&row);
          } else {
            RingGet(be, s.state->mtp.chain[j - 1], t, 1, X, s.offset + (t - s.start));
          }
        }
        const int64_t from = std::max(s.start, p.start + 1);
        if (from <= work[k].last)
          be.CopyRows(outs[j - 1], p.offset + (from - 1 - p.start), X, s.offset + (from - s.start), work[k].last - from + 1);
      }
    });
    if (j + 1 < n)  // block j+1's input history: this block's output for t, at position t+1
      for (const SeqRows& s : seqs) {
        Tensor& ring = s.state->mtp.chain[j];
        const int64_t from = std::max(s.start, s.start + s.count - ring.shape[0]);
        RingPut(be, outs[j], s.offset + (from - s.start), from + 1, s.start + s.count - from, &ring);
      }
  }
  for (const Work& w : work) w.st->mtp.length = w.last + 1;

  // Step 2: the drafts. Draft step s comes from block min(s, n-1) at position L-1+s. A block's first step
  // (s < n) needs its own rows for positions L .. L-1+s (fed block s-1's outputs for L-1 .. L-2+s and the
  // drafts d_1 .. d_s); past the last block, that block is reused on its own output, one row per step.
  // Greedy drafts nobody asked the logits of stay on the backend through the whole chain (each link's
  // picks feed the next link's embedding there) and come to the host once at the end; otherwise each link
  // brings its logits to the host and picks there.
  const bool on_backend = DraftsStayOnBackend(batch);
  std::vector<DraftResult> out(batch.size());
  std::vector<size_t> active;
  std::vector<int> made(batch.size(), 0);
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i].num_drafts > 0) {
      active.push_back(i);
      if (batch[i].want_logits) out[i].logits = AllocateTensor(DType::kF32, {batch[i].num_drafts, V});
    }
  // On the backend, link s's picks: ids I32 [requests drafting at s], and each request's row in them.
  struct Link {
    Tensor ids;
    std::vector<int64_t> row;
  };
  std::vector<Link> links;
  // prev: per active sequence `r` consecutive output rows of the last step's block, positions L-1 .. L-2+r.
  int64_t r = 1;
  Tensor prev = be.Alloc(DType::kF32, {static_cast<int64_t>(active.size()), hc * D});
  {
    std::vector<Backend::RowCopy> copies;
    for (size_t a = 0; a < active.size(); ++a) {
      const SeqRows& s = rows[0][static_cast<size_t>(work_of[active[a]])];
      copies.push_back({&outs[0], s.offset + s.count - 1, &prev, static_cast<int64_t>(a), 1});
    }
    be.CopyRowsBatch(copies);
  }
  for (int step = 0; !active.empty(); ++step) {
    std::vector<int64_t> head_rows;
    for (size_t a = 0; a < active.size(); ++a) head_rows.push_back(static_cast<int64_t>(a) * r + r - 1);
    const MtpWeights& head_block = weights_.mtp[std::min(step, n - 1)];
    if (on_backend) {
      Link link{be.Alloc(DType::kI32, {static_cast<int64_t>(active.size())}), std::vector<int64_t>(batch.size(), -1)};
      PickDraftIds(head_block, prev, head_rows, &link.ids);
      for (size_t a = 0; a < active.size(); ++a) link.row[active[a]] = static_cast<int64_t>(a);
      links.push_back(std::move(link));
    } else {
      std::vector<const DraftRequest*> requests;
      std::vector<DraftResult*> results;
      for (size_t i : active) {
        requests.push_back(&batch[i]);
        results.push_back(&out[i]);
      }
      const std::vector<int32_t> picks = PickDrafts(head_block, prev, head_rows, requests, step, results);
      for (size_t a = 0; a < active.size(); ++a) out[active[a]].tokens.push_back(picks[a]);
    }
    std::vector<size_t> next, keep;
    for (size_t a = 0; a < active.size(); ++a) {
      const size_t i = active[a];
      if (++made[i] < batch[i].num_drafts) {
        next.push_back(i);
        keep.push_back(a);
      }
    }
    if (next.empty()) break;
    const int s = step + 1;
    const bool fresh = s < n;  // block s runs for the first time in this chain
    const int b = std::min(s, n - 1);
    const int64_t count = fresh ? s : 1;
    std::vector<SeqRows> cs;
    std::vector<int64_t> pos;
    std::vector<int32_t> tok;  // on the backend: placeholders (the ids come from the links)
    std::vector<Backend::RowCopy> id_copies;
    for (size_t k = 0; k < next.size(); ++k) {
      SequenceStateData& st = batch[next[k]].state->data();
      const int64_t first = fresh ? st.length : st.length - 1 + s;
      cs.push_back({&st, static_cast<int64_t>(k) * count, count, first});
      for (int64_t q = 0; q < count; ++q) {
        pos.push_back(first + q);
        const int64_t d = first + q - st.length;  // position p is fed draft p+1-L
        if (on_backend) {
          tok.push_back(0);
          const Link& l = links[static_cast<size_t>(d)];
          id_copies.push_back({&l.ids, l.row[next[k]], nullptr, static_cast<int64_t>(k) * count + q, 1});
        } else {
          tok.push_back(out[next[k]].tokens[d]);
        }
      }
    }
    std::function<void(Tensor*)> fill_ids;
    if (on_backend)
      fill_ids = [&](Tensor* ids) {
        for (Backend::RowCopy& c : id_copies) c.dst = ids;
        be.CopyRowsBatch(id_copies);
      };
    // (ring rows past mtp.length: forgotten, within the spare)
    Tensor y = MtpBlockStep(
        weights_.mtp[b], cs, pos, tok, {},
        [&](Tensor* x) {
          std::vector<Backend::RowCopy> copies;
          for (size_t k = 0; k < next.size(); ++k)
            copies.push_back({&prev, static_cast<int64_t>(keep[k]) * r + r - count, x, static_cast<int64_t>(k) * count, count});
          be.CopyRowsBatch(copies);
        },
        fill_ids);
    if (fresh) {  // the next block's inputs: this block's catch-up output for L-1, then the rows just made
      prev = be.Alloc(DType::kF32, {static_cast<int64_t>(next.size()) * (count + 1), hc * D});
      std::vector<Backend::RowCopy> copies;
      for (size_t k = 0; k < next.size(); ++k) {
        const SeqRows& c0 = rows[b][static_cast<size_t>(work_of[next[k]])];
        copies.push_back({&outs[b], c0.offset + c0.count - 1, &prev, static_cast<int64_t>(k) * (count + 1), 1});
        copies.push_back({&y, static_cast<int64_t>(k) * count, &prev, static_cast<int64_t>(k) * (count + 1) + 1, count});
      }
      be.CopyRowsBatch(copies);
      r = count + 1;
    } else {
      prev = y;
      r = 1;
    }
    active = next;
  }
  if (on_backend && !links.empty()) {
    // Every link's picks in one buffer, one copy to the host.
    int64_t total = 0;
    for (const Link& l : links) total += l.ids.numel();
    Tensor all = be.Alloc(DType::kI32, {total});
    std::vector<Backend::RowCopy> copies;
    int64_t at = 0;
    for (const Link& l : links) {
      copies.push_back({&l.ids, 0, &all, at, l.ids.numel()});
      at += l.ids.numel();
    }
    be.CopyRowsBatch(copies);
    std::vector<int32_t> host(static_cast<size_t>(total));
    be.ToHost(all, host.data());
    at = 0;
    for (const Link& l : links) {
      for (size_t i = 0; i < batch.size(); ++i)
        if (l.row[i] >= 0) out[i].tokens.push_back(host[static_cast<size_t>(at + l.row[i])]);
      at += l.ids.numel();
    }
  }
  return out;
}

}  // namespace dsmesh

#include "kernels/cuda/cuda_graph_recorder.h"

#include <cstdio>
#include <stdexcept>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/graph_chain.h"

namespace dsmesh {

GraphRecorder::GraphRecorder(std::shared_ptr<StreamContext> ctx, StepArena& arena, CudaBackendCounters& counters)
    : ctx_(std::move(ctx)), arena_(arena), counters_(counters) {}

void GraphRecorder::Recorded::Destroy() {
  if (exec) cudaGraphExecDestroy(exec);
  if (emptied) cudaGraphExecDestroy(emptied);
  if (graph) cudaGraphDestroy(graph);
  exec = emptied = nullptr;
  graph = nullptr;
}

GraphRecorder::~GraphRecorder() {
  for (auto& [k, g] : graphs_) g.rec.Destroy();
  auto destroy = [](StatefulGraph& g) {
    g.rec.Destroy();
    if (g.uploaded) cudaEventDestroy(g.uploaded);
    cudaFreeHost(g.params.host);
    cudaFree(g.params.dev);
  };
  for (auto& [k, g] : stateful_graphs_) destroy(g);
  for (auto& [k, g] : block_graphs_) destroy(g);
}

void GraphRecorder::Segment(const Backend::SegmentKey& key, bool graphs, const std::function<void()>& ops) {
  if (nest_) {
    BlockPart(key, ops);
    return;
  }
  if (!graphs || !arena_.in_step() || key.rows > kGraphMaxRows || arena_.step_rows() > kGraphMaxRows) {
    ++counters_.eager_segments;
    ops();
    return;
  }
  auto [it, first_time] = graphs_.try_emplace(key);
  Graph& g = it->second;
  if (first_time || g.failed) {  // first sight: eager, which also builds what the ops create lazily
    ++counters_.eager_segments;
    ops();
    return;
  }
  if (g.rec.exec) {
    if (arena_.top() != g.scratch_begin)
      throw std::runtime_error("cuda backend: graph segment (site " + std::to_string(key.site) + ", layer " +
                               std::to_string(key.layer) + ", rows " + std::to_string(key.rows) +
                               ") replayed at scratch offset " + std::to_string(arena_.top()) + ", captured at " +
                               std::to_string(g.scratch_begin));
    ctx_->Use();
    {
      const HostTimer t(counters_.host_graph_launch_ns);
      CudaCheck(cudaGraphLaunch(g.rec.exec, ctx_->stream), "cudaGraphLaunch");
    }
    ++counters_.host_graph_launches;
    arena_.SetTop(g.scratch_end);
    ++counters_.graph_replays;
    counters_.replayed_nodes += g.rec.shape.nodes;
    NoteReplay(key, false, &g.rec);
    return;
  }
  Capture(key, &g, ops);
}

void GraphRecorder::StatefulSegment(const Backend::SegmentKey& key, bool graphs, const std::function<void()>& ops) {
  // (inside a block record, its ops stage into the block's buffers and launch into the block's capture)
  if (!graphs || !arena_.in_step() || key.rows > kGraphMaxRows ||
      arena_.step_rows() > kGraphMaxRows || arena_.capturing() || nest_) {
    ops();
    return;
  }
  auto [it, first_time] = stateful_graphs_.try_emplace(std::make_pair(key, arena_.key_bucket()));
  StatefulGraph& g = it->second;
  if (g.failed) {
    ++counters_.eager_segments;
    ops();
    return;
  }
  if (first_time) {  // eager, noting whether every op could be recorded
    ++counters_.eager_segments;
    arena_.ClearUnrecordable();
    arena_.SetMode(StatefulMode::kProbing);
    try {
      ops();
    } catch (...) {
      arena_.SetMode(StatefulMode::kNone);
      throw;
    }
    arena_.SetMode(StatefulMode::kNone);
    if (!arena_.unrecordable().empty()) {
      g.failed = true;
      ++counters_.graph_failures;
      ++counters_.stateful_failures;
      if (!logged_stateful_failure_)
        std::fprintf(stderr, "[cuda] the stateful segment of layer %d (%lld rows) runs eagerly: %s (counted in "
                             "CudaBackendStats().graphs.failures; logged once)\n",
                     key.layer, static_cast<long long>(key.rows), arena_.unrecordable().c_str());
      logged_stateful_failure_ = true;
    }
    return;
  }
  if (!g.rec.exec) {
    CaptureStateful(key, &g, nullptr, ops);
    return;
  }
  ReplayStateful(key, &g, nullptr, ops);
}

// Records `ops` on the stream into *rec (graph, executable, shape); returns why that failed ("" on success).
std::string GraphRecorder::CaptureGraph(const std::function<void()>& ops, Recorded* rec) {
  std::string why;
  cudaGraph_t graph = nullptr;
  CudaCheck(cudaStreamBeginCapture(ctx_->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  arena_.SetCapturing(true);
  try {
    ops();
  } catch (const std::exception& e) {
    why = e.what();
  }
  arena_.SetCapturing(false);
  const cudaError_t end = cudaStreamEndCapture(ctx_->stream, &graph);
  if (why.empty() && end != cudaSuccess) why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
  if (why.empty()) {
    try {
      rec->shape = ShapeOfGraph(graph);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  if (why.empty()) {
    const cudaError_t inst = cudaGraphInstantiate(&rec->exec, graph, 0);
    if (inst != cudaSuccess) {
      why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
      rec->exec = nullptr;
    }
  }
  if (why.empty()) {
    rec->graph = graph;  // kept: the empty-kernel copy is cloned from it
  } else {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  return why;
}

// Records `ops` as a CUDA graph and launches it; on failure (an op that syncs or copies host metadata,
// such as the per-expert MoE path) runs `ops` eagerly and never tries the key again.
void GraphRecorder::Capture(const Backend::SegmentKey& key, Graph* g, const std::function<void()>& ops) {
  ctx_->Use();
  const size_t begin = arena_.top();
  const std::string why = CaptureGraph(ops, &g->rec);
  if (!why.empty()) {
    g->failed = true;
    ++counters_.graph_failures;
    if (!logged_capture_failure_)
      std::fprintf(stderr, "[cuda] graph capture failed (site %d, layer %d, rows %lld): %s; such segments run "
                           "eagerly (counted in CudaBackendStats().graphs.failures; logged once)\n",
                   key.site, key.layer, static_cast<long long>(key.rows), why.c_str());
    logged_capture_failure_ = true;
    arena_.SetTop(begin);
    ++counters_.eager_segments;
    ops();
    return;
  }
  g->scratch_begin = begin;
  g->scratch_end = arena_.top();
  if (!logged_graphs_) {
    std::fprintf(stderr, "[cuda] decode steps of up to %lld rows replay CUDA graphs (collectives stay eager; "
                         "--enforce-eager turns graphs off)\n", static_cast<long long>(kGraphMaxRows));
    logged_graphs_ = true;
  }
  ++counters_.graph_captures;
  CudaCheck(cudaGraphLaunch(g->rec.exec, ctx_->stream), "cudaGraphLaunch");
}

void GraphRecorder::LaunchStateful(StatefulGraph* g) {
  if (g->params.used > 0)
    CudaCheck(cudaMemcpyAsync(g->params.dev, g->params.host, g->params.used, cudaMemcpyHostToDevice, ctx_->stream),
              "stateful segment parameters upload");
  CudaCheck(cudaEventRecord(g->uploaded, ctx_->stream), "cudaEventRecord");
  CudaCheck(cudaGraphLaunch(g->rec.exec, ctx_->stream), "cudaGraphLaunch");
  arena_.SetTop(g->scratch_end);
}

// Records a stateful record: its ops stage into the record's buffers and launch into the capture; a block's
// plain segments go into the same capture (BlockPart).
void GraphRecorder::CaptureStateful(const Backend::SegmentKey& key, StatefulGraph* g, BlockGraph* block,
                                    const std::function<void()>& ops) {
  ctx_->Use();
  EnsureStagingBuffers(g);
  const size_t begin = arena_.top();
  std::string why;
  {
    if (block) block->parts.clear();
    Nest nest{block, false};
    NestScope scope(this, block ? &nest : nullptr);
    StepArena::StagingInto into(&arena_, &g->params, StatefulMode::kRecording);
    why = CaptureGraph(ops, &g->rec);
  }
  if (!why.empty()) {
    // The first run showed every op recordable (a block: every part recorded alone), so this is
    // unexpected. The ops ran their host logic (sequence states moved on) but nothing they launched ran:
    // the step cannot be redone here, so it fails loudly; the key runs eagerly from the next step on.
    g->failed = true;
    ++counters_.graph_failures;
    throw std::runtime_error(std::string("cuda backend: recording the ") + RecordName(block) + " (layer " +
                             std::to_string(key.layer) + ", rows " + std::to_string(key.rows) + ") failed: " + why);
  }
  g->scratch_begin = begin;
  g->scratch_end = arena_.top();
  g->params.captured = g->params.used;
  ++counters_.stateful_captures;
  ++counters_.graph_captures;
  bool& logged = block ? logged_block_graphs_ : logged_stateful_graphs_;
  if (!logged)
    std::fprintf(stderr, block ? "[cuda] decode blocks replay as one CUDA graph each (attention inputs, stateful part, "
                                 "attention output + FFN), their parameters staged per step\n"
                               : "[cuda] the stateful part of decode steps (compressors, indexer, attention) replays "
                                 "CUDA graphs too, its parameters staged per step\n");
  logged = true;
  LaunchStateful(g);
}

// Runs a stateful record's ops only for their parameters (a block's plain segments skipped), checks them
// against the record, uploads them and launches the graph.
void GraphRecorder::ReplayStateful(const Backend::SegmentKey& key, StatefulGraph* g, BlockGraph* block,
                                   const std::function<void()>& ops) {
  const std::string what = std::string(RecordName(block)) + " (layer " + std::to_string(key.layer) + ", rows " +
                           std::to_string(key.rows) + ")";
  if (arena_.top() != g->scratch_begin)
    throw std::runtime_error("cuda backend: " + what + " replayed at scratch offset " + std::to_string(arena_.top()) +
                             ", captured at " + std::to_string(g->scratch_begin));
  ctx_->Use();
  {
    const HostTimer t(counters_.step_sync_wait_ns);
    CudaCheck(cudaEventSynchronize(g->uploaded), "recorded parameters");  // the last upload read them
  }
  Nest nest{block, true};
  {
    const HostTimer t(counters_.host_stateful_ops_ns);
    NestScope scope(this, block ? &nest : nullptr);
    StepArena::StagingInto into(&arena_, &g->params, StatefulMode::kReplaying);
    ops();
  }
  const size_t parts = block ? block->parts.size() : 0;
  if (nest.next != parts || g->params.used != g->params.captured || arena_.top() != g->scratch_end ||
      g->params.shapes_seen != g->params.shapes.size())
    throw std::runtime_error("cuda backend: " + what + " met " + std::to_string(nest.next) + " of its " +
                             std::to_string(parts) + " plain segments, staged " + std::to_string(g->params.used) +
                             " parameter bytes and ended at scratch " + std::to_string(arena_.top()) +
                             "; its record has " + std::to_string(g->params.captured) + " and " +
                             std::to_string(g->scratch_end));
  {
    const HostTimer t(counters_.host_graph_launch_ns);
    LaunchStateful(g);
  }
  ++counters_.host_graph_launches;
  ++counters_.graph_replays;
  ++counters_.stateful_replays;
  counters_.replayed_nodes += g->rec.shape.nodes;
  NoteReplay(key, true, &g->rec);
}

void GraphRecorder::EnsureStagingBuffers(StatefulGraph* g) {
  if (g->params.host) return;
  CudaCheck(cudaMallocHost(&g->params.host, StagedParams::kBytes), "cudaMallocHost for segment parameters");
  CudaCheck(cudaMalloc(&g->params.dev, StagedParams::kBytes), "cudaMalloc for segment parameters");
  CudaCheck(cudaEventCreateWithFlags(&g->uploaded, cudaEventDisableTiming), "cudaEventCreate");
}

void GraphRecorder::BlockSegment(const Backend::SegmentKey& key, bool graphs, const std::function<void()>& ops) {
  if (!graphs || !arena_.in_step() || key.rows > kGraphMaxRows || arena_.step_rows() > kGraphMaxRows ||
      arena_.capturing() || nest_ || arena_.mode() != StatefulMode::kNone) {
    ops();
    return;
  }
  BlockGraph& g = block_graphs_[std::make_pair(key, arena_.key_bucket())];
  if (g.failed || g.sightings < 2) {
    // The parts on their own: the first sighting records nothing new, the second must find every part
    // recorded (or record it now) without an eager run or a failed capture.
    const int64_t eager = counters_.eager_segments, failures = counters_.graph_failures;
    ops();
    if (!g.failed && ++g.sightings == 2 && (counters_.eager_segments != eager || counters_.graph_failures != failures)) {
      g.failed = true;
      if (!logged_block_apart_)
        std::fprintf(stderr, "[cuda] the decode block of layer %d (%lld rows) keeps its segments apart: a part of it "
                             "runs eagerly or failed to record (logged once)\n",
                     key.layer, static_cast<long long>(key.rows));
      logged_block_apart_ = true;
    }
    return;
  }
  if (!g.rec.exec) {
    CaptureStateful(key, &g, &g, ops);
    return;
  }
  ReplayStateful(key, &g, &g, ops);
}

void GraphRecorder::BlockPart(const Backend::SegmentKey& key, const std::function<void()>& ops) {
  Nest& n = *nest_;
  if (n.replaying) {
    if (n.next >= n.block->parts.size() || arena_.top() != n.block->parts[n.next].first)
      throw std::runtime_error("cuda backend: block replay: segment (site " + std::to_string(key.site) + ", layer " +
                               std::to_string(key.layer) + ") is not where the block's capture had its part " +
                               std::to_string(n.next));
    arena_.SetTop(n.block->parts[n.next].second);
    ++n.next;
    return;
  }
  const size_t begin = arena_.top();
  arena_.SetPlainOps(true);
  try {
    ops();
  } catch (...) {
    arena_.SetPlainOps(false);
    throw;
  }
  arena_.SetPlainOps(false);
  n.block->parts.push_back({begin, arena_.top()});
}

void GraphRecorder::NoteReplay(const Backend::SegmentKey& key, bool stateful, Recorded* rec) {
  if (in_traced_step_) trace_.push_back({rec, {key.layer, key.site, stateful, rec->shape}});
}

void GraphRecorder::BeginStep() {
  in_traced_step_ = tracing_;
  if (!in_traced_step_) return;
  trace_.clear();
  step_eager_ = counters_.eager_segments;
  step_captures_ = counters_.graph_captures;
}

void GraphRecorder::EndStep() {
  if (!in_traced_step_) return;
  in_traced_step_ = false;
  last_trace_ = std::move(trace_);
  trace_.clear();
  last_eager_ = counters_.eager_segments - step_eager_;
  last_captures_ = counters_.graph_captures - step_captures_;
}

StepGraphProfile GraphRecorder::TakeTrace(int replays) {
  StepGraphProfile out;
  out.eager_segments = last_eager_;
  out.captures = last_captures_;
  for (const Traced& t : last_trace_) out.graphs.push_back(t.graph);
  if (replays <= 0 || last_trace_.empty()) return out;
  ctx_->Use();
  std::vector<cudaGraphExec_t> real, emptied;
  int64_t kept = 0;
  for (const Traced& t : last_trace_) {
    if (!t.rec->emptied) t.rec->emptied = InstantiateEmptied(t.rec->graph, &t.rec->emptied_kept);  // built once
    kept += t.rec->emptied_kept;
    real.push_back(t.rec->exec);
    emptied.push_back(t.rec->emptied);
  }
  CudaCheck(cudaStreamSynchronize(ctx_->stream), "graph replays: the step before");
  out.replays = replays;
  out.replay_ms = TimeGraphReplays(real, replays, ctx_->stream);
  out.chain_ms = TimeGraphReplays(emptied, replays, ctx_->stream);
  out.kept_nodes = kept;
  return out;
}

}  // namespace dsmesh

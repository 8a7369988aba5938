// The CUDA graphs of the forward's segments, both kinds (kernels/backend.h):
//
// - Per-token segments (Backend::Segment): a segment of a step of at most kGraphMaxRows rows runs eagerly
//   the first time its key is seen, is captured the second time and replayed from then on. A capture that
//   fails (an op that syncs or copies host metadata) is logged once and the key runs eagerly for good.
// - Stateful segments (Backend::StatefulSegment: the compressors, indexer and attention of a block) are
//   recorded the same way, keyed also by the step's key bucket, but their host logic runs every step: when
//   replaying, the ops only stage their per-step launch parameters (cuda_ops::ParamStager) into the record's
//   buffer (StagedParams), one copy uploads them, and the graph replays. The first run probes whether every
//   op can be recorded (StepArena::Unrecordable); one that cannot keeps the key eager.
//
// Every replay checks that it starts at the scratch offset its capture did (the graph's temporaries live at
// fixed arena addresses); a stateful replay also checks that it staged as many parameter bytes, ended at
// the same offset and needed the same launch shapes (StepArena::LaunchShape) as its record. It lives apart
// from the ops because recording is about the order and addresses of launches, never what they compute.
//
// Each record keeps its cudaGraph_t and shape (nodes, longest chain). With tracing on (`dsmesh bench
// --profile`), every step notes the graphs it replays; TakeTrace returns the last traced step's and can
// time them replayed back to back, as recorded and with empty kernels (kernels/cuda/graph_chain.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/graph_shape.h"
#include "kernels/cuda/cuda_backend_util.h"
#include "kernels/cuda/cuda_step_arena.h"

namespace dsmesh {

class GraphRecorder {
 public:
  GraphRecorder(std::shared_ptr<StreamContext> ctx, StepArena& arena, CudaBackendCounters& counters);
  ~GraphRecorder();
  GraphRecorder(const GraphRecorder&) = delete;
  GraphRecorder& operator=(const GraphRecorder&) = delete;

  // Backend::Segment; with `graphs` false (graphs off, or ops being profiled) every segment runs eagerly.
  void Segment(const Backend::SegmentKey& key, bool graphs, const std::function<void()>& ops);
  // Backend::StatefulSegment: recorded like a Segment (first sight eager, second captured, then replayed),
  // but `ops` runs every time: when replaying, its ops only compute and stage their parameters (each
  // launch's parameter block, cuda_ops::ParamStager) into the record's own buffer, which one copy uploads
  // before the graph launches. The record's key adds the step's key bucket (the indexer's launch covers
  // bucket / ratio keys; StepArena::IndexerKeysLd). With `graphs` false it runs eagerly.
  void StatefulSegment(const Backend::SegmentKey& key, bool graphs, const std::function<void()>& ops);
  // Backend::BlockSegment: a decode block's segments and stateful segment as one record, keyed also by the
  // step's key bucket. Its first two sightings run the parts as they are (each recording its own graph, so
  // the second proves every part recordable alone; a part that stayed eager or failed keeps the block apart
  // for good); the third captures the whole block, the plain segments' ops straight into the capture; from
  // then on `ops` runs only for the stateful part's parameters (each plain segment skipped, the arena moved
  // to where it ended at the capture) and the block's graph replays after one upload, as a stateful
  // record's does. Counted as stateful captures and replays.
  void BlockSegment(const Backend::SegmentKey& key, bool graphs, const std::function<void()>& ops);

  // Backend::TraceStepGraphs: while on, BeginStep .. EndStep note the graphs the step replays.
  void Trace(bool on) { tracing_ = on; }
  void BeginStep();
  void EndStep();
  // Backend::TakeStepGraphs: the last traced step's graphs, and with replays > 0 their replay times.
  StepGraphProfile TakeTrace(int replays);

 private:
  // What every record holds: the graph as captured (kept for its shape and its empty-kernel copy), its
  // executable, and the empty-kernel executable once built.
  struct Recorded {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr, emptied = nullptr;
    GraphShape shape;
    int64_t emptied_kept = 0;  // nodes the empty-kernel copy left as recorded
    void Destroy();
  };
  struct Graph {
    Recorded rec;
    size_t scratch_begin = 0, scratch_end = 0;
    bool failed = false;
  };
  // A recorded stateful segment: its graph, and the buffers its launches' parameter blocks are staged in.
  struct StatefulGraph {
    Recorded rec;
    size_t scratch_begin = 0, scratch_end = 0;
    bool failed = false;
    StagedParams params;
    cudaEvent_t uploaded = nullptr;
  };
  // A recorded block (BlockSegment): a stateful record whose graph also holds the block's plain segments.
  struct BlockGraph : StatefulGraph {
    int sightings = 0;
    std::vector<std::pair<size_t, size_t>> parts;  // each plain segment's scratch begin and end, in order
  };
  // The block record being captured or replayed: its plain segments are parts of it (Segment).
  struct Nest {
    BlockGraph* block;
    bool replaying;
    size_t next = 0;  // the part a replay is at
  };
  class NestScope {
   public:
    NestScope(GraphRecorder* r, Nest* nest) : r_(r) { r_->nest_ = nest; }
    ~NestScope() { r_->nest_ = nullptr; }
    NestScope(const NestScope&) = delete;
    NestScope& operator=(const NestScope&) = delete;

   private:
    GraphRecorder* r_;
  };
  // A graph a traced step replayed (records live in the maps below, whose elements never move).
  struct Traced {
    Recorded* rec;
    StepGraph graph;
  };

  // Records `ops` on the stream into *rec (graph, executable, shape); returns why that failed ("" on success).
  std::string CaptureGraph(const std::function<void()>& ops, Recorded* rec);
  void NoteReplay(const Backend::SegmentKey& key, bool stateful, Recorded* rec);
  // Records `ops` as a CUDA graph and launches it; on failure (an op that syncs or copies host metadata,
  // such as the per-expert MoE path) runs `ops` eagerly and never tries the key again.
  void Capture(const Backend::SegmentKey& key, Graph* g, const std::function<void()>& ops);
  // Uploads the record's staged parameters and launches its graph.
  void LaunchStateful(StatefulGraph* g);
  // A stateful record's capture (its ops stage into the record's buffers and launch into the capture) and
  // replay (its ops only stage; one upload, then the graph). With `block` (g itself) the record is a
  // block's: its plain segments go into the same capture and are skipped when it replays (BlockPart).
  void CaptureStateful(const Backend::SegmentKey& key, StatefulGraph* g, BlockGraph* block,
                       const std::function<void()>& ops);
  void ReplayStateful(const Backend::SegmentKey& key, StatefulGraph* g, BlockGraph* block,
                      const std::function<void()>& ops);
  static const char* RecordName(const BlockGraph* block) { return block ? "decode block" : "stateful segment"; }
  // The pinned and device buffers a stateful record stages into, and its upload event (made once).
  void EnsureStagingBuffers(StatefulGraph* g);
  // A plain segment inside a block record being captured (its ops go into the capture) or replayed
  // (skipped: the arena moves to where the part ended).
  void BlockPart(const Backend::SegmentKey& key, const std::function<void()>& ops);

  std::shared_ptr<StreamContext> ctx_;
  StepArena& arena_;
  CudaBackendCounters& counters_;
  std::map<Backend::SegmentKey, Graph> graphs_;
  // Stateful records by (key, the step's key bucket).
  std::map<std::pair<Backend::SegmentKey, int64_t>, StatefulGraph> stateful_graphs_;
  // Block records by (key, the step's key bucket).
  std::map<std::pair<Backend::SegmentKey, int64_t>, BlockGraph> block_graphs_;
  Nest* nest_ = nullptr;
  bool logged_block_graphs_ = false, logged_block_apart_ = false;
  bool logged_graphs_ = false, logged_capture_failure_ = false;
  bool logged_stateful_graphs_ = false, logged_stateful_failure_ = false;
  bool tracing_ = false, in_traced_step_ = false;
  std::vector<Traced> trace_, last_trace_;
  int64_t step_eager_ = 0, step_captures_ = 0;  // the counters at the traced step's start, then its counts
  int64_t last_eager_ = 0, last_captures_ = 0;
};

}  // namespace dsmesh

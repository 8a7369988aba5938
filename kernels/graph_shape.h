// The shape of a recorded step: how many nodes its CUDA graphs hold and how many of them depend on one
// another (the longest chain), per graph and for a whole decode step (`dsmesh bench --profile`). Plain
// data and the chain computation, so that they are tested without a GPU; kernels/cuda/graph_chain.h reads
// a cudaGraph_t into them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dsmesh {

enum class GraphNodeKind { kKernel, kMemcpy, kMemset, kOther };

// One graph: its nodes by kind, and `chain`, the most work nodes (kernels, copies, sets) on one path of
// dependencies; nodes of other kinds (empty joins, events) count 0 on a path.
struct GraphShape {
  int64_t nodes = 0, kernels = 0, memcpys = 0, memsets = 0, other = 0;
  int64_t chain = 0;
  // Edges that let the downstream kernel start before the upstream one completes (programmatic dependent
  // launch captured into the graph; kernels/cuda/pdl_launch.cuh). Counted in `chain` like any edge.
  int64_t programmatic_edges = 0;
};

// The shape of a graph whose node i has kinds[i] and whose edges run from edges[j].first to
// edges[j].second (a dependency: second starts after first). Throws std::invalid_argument on an edge to a
// node that does not exist or on a cycle.
GraphShape AnalyzeGraph(const std::vector<GraphNodeKind>& kinds, const std::vector<std::pair<int64_t, int64_t>>& edges);

// One graph replayed in a traced step, in replay order.
struct StepGraph {
  int layer = -1;        // the segment's layer (-1: none, e.g. the embedding or the head)
  int site = 0;          // which run of the forward (Backend::SegmentKey::site)
  bool stateful = false; // a stateful segment (compressors, indexer, attention)
  GraphShape shape;
};

// The graphs one decode step replays (Backend::TakeStepGraphs). The graphs of a step run one after the
// other on one stream, so the step's dependent nodes are the sum of the graphs' chains.
struct StepGraphProfile {
  std::vector<StepGraph> graphs;
  int64_t eager_segments = 0;  // segments of the traced step that ran eagerly (not in any graph)
  int64_t captures = 0;        // segments recorded in the traced step (0 once every key was seen twice)
  // With replays > 0: the step's graphs launched back to back `replays` times, ms per step: as recorded,
  // and with every kernel replaced by an empty one of the same launch shape and every copy and set cut
  // to one byte (the chain of dependent launches alone). kept_nodes: nodes that could not be emptied or
  // cut (left as recorded).
  int replays = 0;
  double replay_ms = 0, chain_ms = 0;
  int64_t kept_nodes = 0;

  int64_t nodes() const;
  int64_t chain() const;
  // The layers' nodes and chains (graphs with layer >= 0), and the rest.
  struct LayerSplit {
    int layers = 0;
    int64_t layer_nodes = 0, layer_chain = 0, other_nodes = 0, other_chain = 0;
  };
  LayerSplit SplitByLayer() const;
};

}  // namespace dsmesh

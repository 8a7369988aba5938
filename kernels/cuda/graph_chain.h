// What a recorded CUDA graph is made of, and its launches without their work: the node kinds and the
// longest dependency chain (kernels/graph_shape.h), a copy whose kernels do nothing (same grid, block and
// dynamic shared memory, no parameters) and whose copies and sets move one byte, and the time of graphs
// replayed back to back. `dsmesh bench --profile` uses them to measure a decode step's chain of dependent
// launches apart from its bytes (GraphRecorder traces which graphs a step replays).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/graph_shape.h"

namespace dsmesh {

// The nodes of `graph` by kind, its longest chain of work nodes and its programmatic edges.
GraphShape ShapeOfGraph(cudaGraph_t graph);

// `graph` with every kernel node running the empty kernel at its launch shape and every memcpy / memset
// node cut to one byte (one element), instantiated. Nodes whose parameters cannot be read or replaced stay
// as recorded and are counted in *kept.
cudaGraphExec_t InstantiateEmptied(cudaGraph_t graph, int64_t* kept);

// Launches `execs` in order on `stream`, once to warm up and then `replays` times, and returns the device
// time per round in ms (events on the stream).
double TimeGraphReplays(const std::vector<cudaGraphExec_t>& execs, int replays, cudaStream_t stream);

}  // namespace dsmesh

#include "kernels/cuda/graph_chain.h"

#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/empty_kernel.h"

namespace dsmesh {
namespace {

std::vector<cudaGraphNode_t> NodesOf(cudaGraph_t graph) {
  size_t count = 0;
  CudaCheck(cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) CudaCheck(cudaGraphGetNodes(graph, nodes.data(), &count), "cudaGraphGetNodes");
  return nodes;
}

GraphNodeKind KindOf(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  CudaCheck(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType");
  switch (type) {
    case cudaGraphNodeTypeKernel: return GraphNodeKind::kKernel;
    case cudaGraphNodeTypeMemcpy: return GraphNodeKind::kMemcpy;
    case cudaGraphNodeTypeMemset: return GraphNodeKind::kMemset;
    default: return GraphNodeKind::kOther;
  }
}

}  // namespace

GraphShape ShapeOfGraph(cudaGraph_t graph) {
  const std::vector<cudaGraphNode_t> nodes = NodesOf(graph);
  std::map<cudaGraphNode_t, int64_t> index;
  std::vector<GraphNodeKind> kinds;
  for (cudaGraphNode_t n : nodes) {
    index[n] = static_cast<int64_t>(kinds.size());
    kinds.push_back(KindOf(n));
  }
  size_t count = 0;
  CudaCheck(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count), "cudaGraphGetEdges");
  std::vector<cudaGraphNode_t> from(count), to(count);
  std::vector<cudaGraphEdgeData> data(count);  // asked for, so that edges with data (programmatic) are returned too
  if (count > 0)
    CudaCheck(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &count), "cudaGraphGetEdges");
  std::vector<std::pair<int64_t, int64_t>> edges;
  int64_t programmatic = 0;
  for (size_t i = 0; i < count; ++i) {
    edges.emplace_back(index.at(from[i]), index.at(to[i]));
    if (data[i].type == cudaGraphDependencyTypeProgrammatic) ++programmatic;
  }
  GraphShape shape = AnalyzeGraph(kinds, edges);
  shape.programmatic_edges = programmatic;
  return shape;
}

cudaGraphExec_t InstantiateEmptied(cudaGraph_t graph, int64_t* kept) {
  static const bool allowed = [] {
    int device = 0, most = 0;
    CudaCheck(cudaGetDevice(&device), "cudaGetDevice");
    CudaCheck(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
              "cudaDeviceGetAttribute (shared memory per block)");
    return cuda_ops::AllowEmptyKernelSharedMemory(most);
  }();
  cudaGraph_t clone = nullptr;
  CudaCheck(cudaGraphClone(&clone, graph), "cudaGraphClone");
  for (cudaGraphNode_t n : NodesOf(clone)) {
    bool done = true;
    switch (KindOf(n)) {
      case GraphNodeKind::kKernel: {
        cudaKernelNodeParams p{};
        done = cudaGraphKernelNodeGetParams(n, &p) == cudaSuccess;
        if (done) {
          p.func = const_cast<void*>(cuda_ops::EmptyKernelFunction());
          p.kernelParams = nullptr;
          p.extra = nullptr;
          if (!allowed) p.sharedMemBytes = 0;
          done = cudaGraphKernelNodeSetParams(n, &p) == cudaSuccess;
        }
        break;
      }
      case GraphNodeKind::kMemcpy: {
        cudaMemcpy3DParms p{};
        done = cudaGraphMemcpyNodeGetParams(n, &p) == cudaSuccess;
        p.extent = make_cudaExtent(1, 1, 1);
        done = done && cudaGraphMemcpyNodeSetParams(n, &p) == cudaSuccess;
        break;
      }
      case GraphNodeKind::kMemset: {
        cudaMemsetParams p{};
        done = cudaGraphMemsetNodeGetParams(n, &p) == cudaSuccess;
        p.width = 1;
        p.height = 1;
        done = done && cudaGraphMemsetNodeSetParams(n, &p) == cudaSuccess;
        break;
      }
      case GraphNodeKind::kOther:
        break;
    }
    if (!done) {
      cudaGetLastError();
      ++*kept;
    }
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, clone, 0);
  cudaGraphDestroy(clone);
  CudaCheck(inst, "cudaGraphInstantiate (empty kernels)");
  return exec;
}

double TimeGraphReplays(const std::vector<cudaGraphExec_t>& execs, int replays, cudaStream_t stream) {
  if (execs.empty() || replays < 1) return 0;
  for (cudaGraphExec_t e : execs) CudaCheck(cudaGraphLaunch(e, stream), "cudaGraphLaunch (warm-up)");
  cudaEvent_t begin, end;
  CudaCheck(cudaEventCreate(&begin), "cudaEventCreate");
  CudaCheck(cudaEventCreate(&end), "cudaEventCreate");
  CudaCheck(cudaEventRecord(begin, stream), "cudaEventRecord");
  for (int r = 0; r < replays; ++r)
    for (cudaGraphExec_t e : execs) CudaCheck(cudaGraphLaunch(e, stream), "cudaGraphLaunch");
  CudaCheck(cudaEventRecord(end, stream), "cudaEventRecord");
  CudaCheck(cudaEventSynchronize(end), "graph replays");
  float ms = 0;
  CudaCheck(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return ms / replays;
}

}  // namespace dsmesh

#include "kernels/graph_shape.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace dsmesh {

GraphShape AnalyzeGraph(const std::vector<GraphNodeKind>& kinds, const std::vector<std::pair<int64_t, int64_t>>& edges) {
  GraphShape s;
  const int64_t n = static_cast<int64_t>(kinds.size());
  s.nodes = n;
  for (GraphNodeKind k : kinds) {
    if (k == GraphNodeKind::kKernel) ++s.kernels;
    if (k == GraphNodeKind::kMemcpy) ++s.memcpys;
    if (k == GraphNodeKind::kMemset) ++s.memsets;
    if (k == GraphNodeKind::kOther) ++s.other;
  }
  std::vector<std::vector<int64_t>> next(n);
  std::vector<int64_t> indegree(n, 0);
  for (const auto& [from, to] : edges) {
    if (from < 0 || from >= n || to < 0 || to >= n)
      throw std::invalid_argument("graph edge " + std::to_string(from) + " -> " + std::to_string(to) + " outside " +
                                  std::to_string(n) + " nodes");
    next[from].push_back(to);
    ++indegree[to];
  }
  // Kahn's order; depth[i] = the most work nodes on a path ending at i.
  std::vector<int64_t> depth(n, 0), ready;
  for (int64_t i = 0; i < n; ++i) {
    if (indegree[i] == 0) ready.push_back(i);
  }
  int64_t seen = 0;
  while (!ready.empty()) {
    const int64_t i = ready.back();
    ready.pop_back();
    ++seen;
    depth[i] += kinds[i] == GraphNodeKind::kOther ? 0 : 1;
    s.chain = std::max(s.chain, depth[i]);
    for (int64_t j : next[i]) {
      depth[j] = std::max(depth[j], depth[i]);
      if (--indegree[j] == 0) ready.push_back(j);
    }
  }
  if (seen != n) throw std::invalid_argument("graph has a cycle");
  return s;
}

int64_t StepGraphProfile::nodes() const {
  int64_t t = 0;
  for (const StepGraph& g : graphs) t += g.shape.nodes;
  return t;
}

int64_t StepGraphProfile::chain() const {
  int64_t t = 0;
  for (const StepGraph& g : graphs) t += g.shape.chain;
  return t;
}

StepGraphProfile::LayerSplit StepGraphProfile::SplitByLayer() const {
  LayerSplit out;
  std::set<int> layers;
  for (const StepGraph& g : graphs) {
    if (g.layer >= 0) {
      layers.insert(g.layer);
      out.layer_nodes += g.shape.nodes;
      out.layer_chain += g.shape.chain;
    } else {
      out.other_nodes += g.shape.nodes;
      out.other_chain += g.shape.chain;
    }
  }
  out.layers = static_cast<int>(layers.size());
  return out;
}

}  // namespace dsmesh

// Node counts and longest chains of small graphs drawn by hand (kernels/graph_shape.h).
#include "kernels/graph_shape.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace dsmesh {
namespace {

using K = GraphNodeKind;

TEST(GraphShape, AStraightChainCountsEveryWorkNode) {
  const GraphShape s = AnalyzeGraph({K::kKernel, K::kMemcpy, K::kKernel, K::kMemset}, {{0, 1}, {1, 2}, {2, 3}});
  EXPECT_EQ(s.nodes, 4);
  EXPECT_EQ(s.kernels, 2);
  EXPECT_EQ(s.memcpys, 1);
  EXPECT_EQ(s.memsets, 1);
  EXPECT_EQ(s.chain, 4);
}

TEST(GraphShape, ParallelBranchesCountTheLongerOne) {
  // A fork (0) into side branches 1 -> 2 and 3, joined by an empty node (4), then 5: the chain is 0 1 2 5.
  const GraphShape s = AnalyzeGraph({K::kKernel, K::kKernel, K::kKernel, K::kKernel, K::kOther, K::kKernel},
                                    {{0, 1}, {1, 2}, {0, 3}, {2, 4}, {3, 4}, {4, 5}});
  EXPECT_EQ(s.nodes, 6);
  EXPECT_EQ(s.other, 1);
  EXPECT_EQ(s.chain, 4);
}

TEST(GraphShape, IndependentNodesAndEmptyGraphs) {
  EXPECT_EQ(AnalyzeGraph({K::kKernel, K::kKernel, K::kKernel}, {}).chain, 1);
  EXPECT_EQ(AnalyzeGraph({}, {}).chain, 0);
  EXPECT_EQ(AnalyzeGraph({K::kOther}, {}).chain, 0);
}

TEST(GraphShape, BadEdgesAndCyclesAreErrors) {
  EXPECT_THROW(AnalyzeGraph({K::kKernel}, {{0, 1}}), std::invalid_argument);
  EXPECT_THROW(AnalyzeGraph({K::kKernel, K::kKernel}, {{0, 1}, {1, 0}}), std::invalid_argument);
}

TEST(GraphShape, AStepSumsItsGraphsAndSplitsThemByLayer) {
  StepGraphProfile p;
  p.graphs.push_back({-1, 0, false, AnalyzeGraph({K::kKernel, K::kKernel}, {{0, 1}})});
  p.graphs.push_back({0, 1, false, AnalyzeGraph({K::kKernel, K::kKernel, K::kKernel}, {{0, 1}})});
  p.graphs.push_back({0, 2, true, AnalyzeGraph({K::kKernel}, {})});
  p.graphs.push_back({1, 1, false, AnalyzeGraph({K::kKernel, K::kKernel}, {{0, 1}})});
  EXPECT_EQ(p.nodes(), 8);
  EXPECT_EQ(p.chain(), 2 + 2 + 1 + 2);
  const StepGraphProfile::LayerSplit l = p.SplitByLayer();
  EXPECT_EQ(l.layers, 2);
  EXPECT_EQ(l.layer_nodes, 6);
  EXPECT_EQ(l.layer_chain, 5);
  EXPECT_EQ(l.other_nodes, 2);
  EXPECT_EQ(l.other_chain, 2);
}

}  // namespace
}  // namespace dsmesh

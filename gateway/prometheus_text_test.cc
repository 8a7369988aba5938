// The exposition primitives: number formatting as Python's prometheus_client writes it (so bucket
// labels match vLLM's, e.g. le="1.0"), label escaping, cumulative histogram buckets, 1-2-5 bounds.
#include "gateway/prometheus_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace dsmesh {
namespace {

TEST(PromFloat, MatchesPythonRepr) {
  EXPECT_EQ(PromFloat(0.001), "0.001");
  EXPECT_EQ(PromFloat(1), "1.0");
  EXPECT_EQ(PromFloat(2560), "2560.0");
  EXPECT_EQ(PromFloat(0.075), "0.075");
  EXPECT_EQ(PromFloat(1e20), "1e+20");
  EXPECT_EQ(PromFloat(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(PromFloat(std::nan("")), "NaN");
}

TEST(PromLabels, EscapesValues) {
  EXPECT_EQ(PromLabels({}), "");
  EXPECT_EQ(PromLabels({{"a", "x"}, {"b", "q\"\\\n"}}), "{a=\"x\",b=\"q\\\"\\\\\\n\"}");
}

TEST(Histogram, CumulativeBucketsSumAndCount) {
  Histogram h({0.1, 1.0});
  h.Observe(0.05);
  h.Observe(0.1);  // le is inclusive
  h.Observe(0.5);
  h.Observe(7);
  std::string out;
  h.Render("m", {{"k", "v"}}, &out);
  EXPECT_EQ(out,
            "m_bucket{k=\"v\",le=\"0.1\"} 2.0\n"
            "m_bucket{k=\"v\",le=\"1.0\"} 3.0\n"
            "m_bucket{k=\"v\",le=\"+Inf\"} 4.0\n"
            "m_sum{k=\"v\"} 7.65\n"
            "m_count{k=\"v\"} 4.0\n");
}

TEST(Buckets125, LikeVllm) {
  EXPECT_EQ(Buckets125(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(Buckets125(4096).back(), 2000);
}

}  // namespace
}  // namespace dsmesh

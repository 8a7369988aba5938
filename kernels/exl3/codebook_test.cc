// Codebook values from docs/exl3-format.md §7.2 (they agree with exllamav3's exl3_codebooks vectors, which
// vectors_test checks for all 65536 states) and the table statistics of §2.5.
#include <cmath>

#include <gtest/gtest.h>

#include "kernels/exl3/codebook.h"

namespace dsmesh {
namespace {

struct Row {
  uint16_t state, inst3, mcg, mul1;
};

TEST(Exl3Codebook, SpecSingleStates) {
  const Row rows[] = {
      {0x0000, 0x3A25, 0x3F60, 0xC2E8}, {0x0001, 0xBB5B, 0x304E, 0x3921}, {0x0002, 0x3B74, 0xBA13, 0xB72D},
      {0x8000, 0xB7F8, 0xB915, 0xBAF2}, {0x1234, 0xC066, 0x3E0F, 0xB89E}, {0xABCD, 0xB98E, 0x35E7, 0xBD42},
      {0xFFFF, 0xB110, 0x3ACD, 0xB936},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(Exl3CodebookFp16(Exl3Codebook::k3Inst, r.state), r.inst3) << std::hex << r.state;
    EXPECT_EQ(Exl3CodebookFp16(Exl3Codebook::kMcg, r.state), r.mcg) << std::hex << r.state;
    EXPECT_EQ(Exl3CodebookFp16(Exl3Codebook::kMul1, r.state), r.mul1) << std::hex << r.state;
  }
}

TEST(Exl3Codebook, TablesMatchScalarAndStatistics) {
  struct Stat {
    Exl3Codebook cb;
    double mean, stddev, min, max;
  };
  const Stat stats[] = {{Exl3Codebook::k3Inst, 0.00021, 1.24371, -3.9570, 3.9727},
                        {Exl3Codebook::kMcg, -0.00004, 1.24411, -3.9492, 3.9492},
                        {Exl3Codebook::kMul1, -0.00193, 1.00031, -3.4531, 3.3477}};
  for (const Stat& st : stats) {
    const uint16_t* t16 = Exl3CodebookTableFp16(st.cb);
    const float* t32 = Exl3CodebookTableF32(st.cb);
    double sum = 0, sum2 = 0, mn = 1e9, mx = -1e9;
    for (uint32_t s = 0; s < 65536; ++s) {
      ASSERT_EQ(t16[s], Exl3CodebookFp16(st.cb, static_cast<uint16_t>(s)));
      sum += t32[s];
      sum2 += double(t32[s]) * t32[s];
      mn = std::min(mn, double(t32[s]));
      mx = std::max(mx, double(t32[s]));
    }
    const double mean = sum / 65536, sd = std::sqrt(sum2 / 65536 - mean * mean);
    EXPECT_NEAR(mean, st.mean, 1e-5) << Exl3CodebookName(st.cb);
    EXPECT_NEAR(sd, st.stddev, 1e-5) << Exl3CodebookName(st.cb);
    EXPECT_NEAR(mn, st.min, 1e-4) << Exl3CodebookName(st.cb);
    EXPECT_NEAR(mx, st.max, 1e-4) << Exl3CodebookName(st.cb);
  }
}

TEST(Exl3Codebook, Names) {
  for (Exl3Codebook cb : {Exl3Codebook::k3Inst, Exl3Codebook::kMcg, Exl3Codebook::kMul1})
    EXPECT_EQ(ParseExl3Codebook(Exl3CodebookName(cb)), cb);
  EXPECT_THROW(ParseExl3Codebook("mcg2", "--codebook"), std::runtime_error);
}

}  // namespace
}  // namespace dsmesh

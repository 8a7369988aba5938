// The PDL stream table (pdl_streams.h): registered streams return their counter, others null; re-
// registering replaces the counter; disabling and the table's bound. Streams are only compared, never
// used, so fake handles serve and no GPU is needed.
#include "kernels/cuda/pdl_streams.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace dsmesh {
namespace {

cudaStream_t FakeStream(uintptr_t i) { return reinterpret_cast<cudaStream_t>(0x1000 + 16 * i); }

TEST(PdlStreams, OnlyRegisteredStreamsLaunchWithPdl) {
  std::atomic<int64_t> a{0}, b{0};
  EXPECT_EQ(PdlLaunchCounter(FakeStream(1)), nullptr);
  EXPECT_EQ(PdlLaunchCounter(nullptr), nullptr);
  EnablePdlOnStream(FakeStream(1), &a);
  EnablePdlOnStream(FakeStream(2), &b);
  EXPECT_EQ(PdlLaunchCounter(FakeStream(1)), &a);
  EXPECT_EQ(PdlLaunchCounter(FakeStream(2)), &b);
  EXPECT_EQ(PdlLaunchCounter(FakeStream(3)), nullptr);
  EnablePdlOnStream(FakeStream(1), &b);  // a second backend on the same stream handle takes it over
  EXPECT_EQ(PdlLaunchCounter(FakeStream(1)), &b);
  DisablePdlOnStream(FakeStream(1));
  DisablePdlOnStream(FakeStream(2));
  EXPECT_EQ(PdlLaunchCounter(FakeStream(1)), nullptr);
  EXPECT_EQ(PdlLaunchCounter(FakeStream(2)), nullptr);
  DisablePdlOnStream(FakeStream(7));  // never registered: nothing to do
}

TEST(PdlStreams, RejectsNullAndMoreStreamsThanTheTableHolds) {
  std::atomic<int64_t> n{0};
  EXPECT_THROW(EnablePdlOnStream(nullptr, &n), std::invalid_argument);
  EXPECT_THROW(EnablePdlOnStream(FakeStream(1), nullptr), std::invalid_argument);
  for (int i = 0; i < kMaxPdlStreams; ++i) EnablePdlOnStream(FakeStream(100 + i), &n);
  EXPECT_THROW(EnablePdlOnStream(FakeStream(99), &n), std::runtime_error);
  DisablePdlOnStream(FakeStream(100));
  EnablePdlOnStream(FakeStream(99), &n);  // a freed slot is reused
  EXPECT_EQ(PdlLaunchCounter(FakeStream(99)), &n);
  DisablePdlOnStream(FakeStream(99));
  for (int i = 1; i < kMaxPdlStreams; ++i) DisablePdlOnStream(FakeStream(100 + i));
  EXPECT_EQ(PdlLaunchCounter(FakeStream(150)), nullptr);
}

}  // namespace
}  // namespace dsmesh

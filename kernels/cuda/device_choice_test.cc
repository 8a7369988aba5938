// The default device from what the CUDA runtime sees (given probes: a GPU machine without one), --device
// taking precedence without a probe, and the real probe with no GPU visible choosing the CPU.
#include "kernels/cuda/device_choice.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace dsmesh {
namespace {

TEST(DeviceChoice, AGpuIsChosenWithItsNameMemoryAndTheWayBack) {
  CudaGpus h200;
  h200.count = 1;
  h200.first_name = "NVIDIA H200";
  h200.first_total_bytes = 150754820096;  // 143771 MiB, as nvidia-smi lists an H200
  const DeviceChoice c = DefaultDevice(h200);
  EXPECT_EQ(c.device, "cuda:0");
  EXPECT_TRUE(c.cuda());
  EXPECT_FALSE(c.given);
  EXPECT_EQ(c.Line(), "device: cuda:0 (NVIDIA H200, 140.4 GiB; found by the CUDA runtime; --device cpu to run on the CPU)");
  h200.count = 8;
  EXPECT_NE(DefaultDevice(h200).Line().find("the first of 8 visible (--device cuda:N for another)"), std::string::npos)
      << DefaultDevice(h200).Line();
}

TEST(DeviceChoice, NoGpuChoosesTheCpuAndSaysWhy) {
  CudaGpus none;
  none.none_reason = "no CUDA GPU is visible: no NVIDIA driver is loaded on this machine";
  const DeviceChoice c = DefaultDevice(none);
  EXPECT_EQ(c.device, "cpu");
  EXPECT_FALSE(c.cuda());
  EXPECT_EQ(c.Line(), "device: cpu (no CUDA GPU is visible: no NVIDIA driver is loaded on this machine; --device cuda "
                      "to require a GPU)");
}

TEST(DeviceChoice, DeviceFlagWins) {
  const DeviceChoice c = ChooseDevice(Flags({"--device", "cuda:1"}, {"device"}));
  EXPECT_EQ(c.device, "cuda:1");
  EXPECT_TRUE(c.given);
  EXPECT_EQ(c.Line(), "device: cuda:1 (given by --device)");
  EXPECT_EQ(ChooseDevice(Flags({"--device", "cpu"}, {"device"})).device, "cpu");
}

TEST(DeviceChoice, NoVisibleGpuChoosesTheCpu) {
  // Before the first CUDA call of this process, so the runtime sees no device even on a GPU machine.
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  const DeviceChoice c = ChooseDevice(Flags({}, {"device"}));
  EXPECT_EQ(c.device, "cpu");
  EXPECT_FALSE(c.given);
  EXPECT_EQ(c.reason.rfind("no CUDA GPU is visible", 0), 0u) << c.reason;
  EXPECT_NE(c.reason.find("CUDA_VISIBLE_DEVICES is set to \"\""), std::string::npos) << c.reason;
}

}  // namespace
}  // namespace dsmesh

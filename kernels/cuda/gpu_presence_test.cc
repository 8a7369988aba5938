// RequireCudaDevice with no GPU visible: the message says so in plain words and names nvidia-smi.
#include "kernels/cuda/gpu_presence.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace dsmesh {
namespace {

TEST(GpuPresence, NoVisibleGpuSaysSoAndNamesNvidiaSmi) {
  // Before the first CUDA call of this process, so the runtime sees no device even on a GPU machine.
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  std::string message;
  try {
    RequireCudaDevice(0, "the test");
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  EXPECT_EQ(message.rfind("the test needs CUDA device 0, but no CUDA GPU is visible", 0), 0u) << message;
  EXPECT_NE(message.find("nvidia-smi"), std::string::npos) << message;
  EXPECT_NE(message.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << message;
  EXPECT_EQ(message.find("upgrade"), std::string::npos) << message;
}

}  // namespace
}  // namespace dsmesh

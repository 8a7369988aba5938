// DSMESH_WORKER_TIMELINE's parsing, and a tracer on a backend without a device timeline (it says so and
// traces nothing). The GPU path is the CUPTI collector's (kernels/cuda/cupti_timeline_test).
#include "worker/step_timeline_tracer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>

#include "kernels/cpu/cpu_backend.h"

namespace dsmesh {
namespace {

TEST(StepTimelineTracer, ParsesTheVariableAndRefusesMalformedValues) {
  auto cpu = MakeCpuBackend(1);
  unsetenv("DSMESH_WORKER_TIMELINE");
  EXPECT_EQ(StepTimelineTracer::FromEnvironment(*cpu), nullptr);
  for (const char* bad : {"8", "a,b", "5,0", "-1,4", "3,4x", ",4", "2,100000"}) {
    setenv("DSMESH_WORKER_TIMELINE", bad, 1);
    try {
      StepTimelineTracer::FromEnvironment(*cpu);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("DSMESH_WORKER_TIMELINE=" + std::string(bad)), std::string::npos) << e.what();
    }
  }
  setenv("DSMESH_WORKER_TIMELINE", "2,3", 1);
  auto tracer = StepTimelineTracer::FromEnvironment(*cpu);
  unsetenv("DSMESH_WORKER_TIMELINE");
  ASSERT_NE(tracer, nullptr);
  testing::internal::CaptureStderr();
  for (int i = 0; i < 8; ++i) {
    tracer->BeginStep();
    tracer->EndStep();
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("needs a CUDA device"), std::string::npos) << err;
  EXPECT_EQ(err.find("needs a CUDA device"), err.rfind("needs a CUDA device")) << "said more than once: " << err;
}

}  // namespace
}  // namespace dsmesh

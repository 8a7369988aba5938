// A kernel that does nothing, for replaying a recorded graph's shape without its work
// (kernels/cuda/graph_chain.h): what is left is the launches and their dependencies.
#pragma once

namespace dsmesh::cuda_ops {

// The empty kernel's function (no parameters), allowed up to `dynamic_smem` bytes of dynamic shared
// memory on the current device (so it takes the launch shape of any kernel it replaces); false when the
// device refuses that much.
const void* EmptyKernelFunction();
bool AllowEmptyKernelSharedMemory(int dynamic_smem);

}  // namespace dsmesh::cuda_ops

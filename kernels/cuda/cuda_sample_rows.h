// The host side of the device row sampler (sampling_ops.h) for Backend::SampleRows: the rows'
// RowSampling as the kernel's parameters, uploaded and launched; and the kernel's output, copied back by
// the caller, as SampledRows (only the tokens and the asked-for logprobs leave the GPU).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_step_arena.h"
#include "kernels/cuda/sampling_ops.h"

namespace dsmesh {

// Samples logits f32 [rows.size(), vocab] (checked by the caller, at least one row) on `stream`: the
// parameters uploaded to the step's scratch, the sampler launched and its launch checked. Returns the
// device buffer of rows.size() cuda_ops::SampleRowOut for the caller to copy to the host.
Tensor LaunchSampleRows(const Tensor& logits, const std::vector<RowSampling>& rows, StepArena& arena,
                        cudaStream_t stream);

// The rows the sampler wrote (copied to the host): each token, and the logprob and top logprobs of the
// rows that asked for them.
std::vector<SampledRow> SampledRowsOf(const std::vector<cuda_ops::SampleRowOut>& host,
                                      const std::vector<RowSampling>& rows, int64_t vocab);

}  // namespace dsmesh

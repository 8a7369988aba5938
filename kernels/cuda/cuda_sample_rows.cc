#include "kernels/cuda/cuda_sample_rows.h"

#include <algorithm>

#include "kernels/cuda/cuda_backend_util.h"
#include "kernels/cuda/cuda_check.h"

namespace dsmesh {

Tensor LaunchSampleRows(const Tensor& logits, const std::vector<RowSampling>& rows, StepArena& arena,
                        cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows.size()), vocab = RowWidth(logits);
  std::vector<cuda_ops::SampleRowParams> params(n);
  for (int64_t r = 0; r < n; ++r) {
    const RowSampling& q = rows[r];
    Require(q.logprobs <= cuda_ops::kSampleMaxTopLogprobs, "SampleRows", "more than 20 top logprobs");
    params[r] = {q.temperature, q.top_k, q.top_p, q.min_p, q.seed, q.position, q.logprobs};
  }
  Tensor dparams = arena.Temp(DType::kU8, {static_cast<int64_t>(n * sizeof(cuda_ops::SampleRowParams))});
  Tensor dout = arena.Temp(DType::kU8, {static_cast<int64_t>(n * sizeof(cuda_ops::SampleRowOut))});
  Tensor scratch = arena.Temp(DType::kU8, {cuda_ops::SampleRowsScratchBytes(n, vocab)});
  CudaCheck(cudaMemcpyAsync(dparams.data, params.data(), dparams.nbytes(), cudaMemcpyHostToDevice, stream),
            "SampleRows parameters upload");
  cuda_ops::SampleRows(F(logits), n, vocab, static_cast<const cuda_ops::SampleRowParams*>(dparams.data), scratch.data,
                       static_cast<cuda_ops::SampleRowOut*>(dout.data), stream);
  CheckLaunch("SampleRows");
  return dout;
}

std::vector<SampledRow> SampledRowsOf(const std::vector<cuda_ops::SampleRowOut>& host,
                                      const std::vector<RowSampling>& rows, int64_t vocab) {
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<SampledRow> out(n);
  for (int64_t r = 0; r < n; ++r) {
    out[r].token = host[r].token;
    if (rows[r].logprobs < 0) continue;
    out[r].logprob = host[r].logprob;
    const int top = static_cast<int>(std::min<int64_t>(rows[r].logprobs, vocab));
    out[r].top_ids.assign(host[r].top_ids, host[r].top_ids + top);
    out[r].top_logprobs.assign(host[r].top_logprobs, host[r].top_logprobs + top);
  }
  return out;
}

}  // namespace dsmesh

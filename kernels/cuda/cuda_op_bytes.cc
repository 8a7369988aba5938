#include "kernels/cuda/cuda_op_bytes.h"

#include <algorithm>

#include "kernels/cuda/cuda_backend_util.h"
#include "kernels/op_bytes.h"

namespace dsmesh {

double HeldWeightBytes(Exl3Weights& exl3, const LinearWeight& w, int groups) {
  if (!w.is_exl3())
    return op_bytes::DenseWeight(w.dense.numel(), static_cast<int64_t>(DTypeSize(w.dense.dtype))) +
           (w.bias.data ? static_cast<double>(w.bias.nbytes()) : 0);
  CudaExl3Linear& e = Exl3Weights::Of(w);
  const int64_t per = w.out / groups;
  double bytes = 0;
  for (int g = 0; g < groups; ++g) {
    const int64_t o0 = e.slice.out_begin + (groups == 1 ? 0 : g * per);
    const Exl3Part& part = exl3.PartFor(e, o0, groups == 1 ? e.slice.out_end : o0 + per);
    const Exl3DeviceLinear& l = part.buffers->linear();
    bytes += op_bytes::Exl3Weight(l.k, l.n, l.K) + (part.bias.data ? static_cast<double>(part.bias.nbytes()) : 0);
  }
  return bytes;
}

double HeldLinearBytes(Exl3Weights& exl3, int64_t m, const LinearWeight& w) {
  return HeldWeightBytes(exl3, w) + op_bytes::LinearActivations(m, w.in, w.out, false);
}

int64_t PoolRowBytes(const PagedRows& rows) {
  return rows.pool ? RowWidth(*rows.pool) * static_cast<int64_t>(DTypeSize(rows.pool->dtype)) : 0;
}

double AttentionKvBytes(int64_t n, int window, const Tensor& ring, const PagedRows* entries, int64_t num_entries,
                        const Tensor* topk) {
  const double ring_row = static_cast<double>(RowWidth(ring)) * DTypeSize(ring.dtype);
  double bytes = ring_row * static_cast<double>(std::min<int64_t>(window, ring.shape.empty() ? 0 : ring.shape[0]) + n);
  if (entries) {
    const int64_t rows = topk ? std::min<int64_t>(num_entries, n * RowWidth(*topk)) : num_entries;
    bytes += static_cast<double>(rows) * static_cast<double>(PoolRowBytes(*entries));
  }
  return bytes;
}

}  // namespace dsmesh

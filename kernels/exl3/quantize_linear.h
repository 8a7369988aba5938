// Quantizing one linear layer to EXL3 without calibration data (exllamav3's `fallback_quant`,
// docs/exl3-format.md §5.1 steps 2-6 and §5.3). No Hessian / LDLQ: every tile is rounded independently.
//
//   1. sv = sign * (column RMS / mean column RMS)  (0 for all-zero columns, e.g. padding)
//   2. W <- (W / sv) Hn
//   3. su = sign * row RMS / codebook std;  W <- Hk (W / su)      (rows now have the codebook's RMS)
//   4. global scale g (Exl3DefaultGlobalScale, refined on a sample of tiles for large matrices);
//      W <- g W, su <- su / g
//   5. every 16x16 tile: tail-biting Viterbi -> 256 states -> packed trellis
//   6. suh = fp16(su), svh = fp16(sv); steps 2-4 use the fp16-rounded scales so nothing drifts.
// Decoding gives W-hat with diag(suh) Hk W-hat Hn diag(svh) ~= W.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/tensor.h"
#include "kernels/exl3/codebook.h"
#include "kernels/exl3/exl3_linear.h"

namespace dsmesh {

struct Exl3QuantOptions {
  int K = 4;
  Exl3Codebook codebook = Exl3Codebook::kMcg;
  uint64_t seed = 0;        // sign patterns (exllamav3 uses the module index)
  bool search_scale = true;  // else g = Exl3DefaultGlobalScale(K)
  // Called from one thread with (tiles done, tiles total) as encoding progresses.
  std::function<void(int64_t, int64_t)> progress;
};

struct Exl3QuantStats {
  double scale = 1;           // the global scale g
  double rotated_mse = 0;     // mean squared error per weight in the rotated, normalized domain
  double rotated_var = 0;     // mean square of the rotated, normalized weights (MSE / var = relative)
  double seconds = 0;
};

// The tensors of one quantized linear, owned. Shapes as in docs/exl3-format.md §1.2.
struct Exl3QuantizedLinear {
  int64_t in_features = 0, out_features = 0;
  int K = 0;
  Exl3Codebook codebook = Exl3Codebook::kMcg;
  Tensor trellis, suh, svh;  // int16 [k/16, n/16, 16K], fp16 [k], fp16 [n]
  Exl3QuantStats stats;

  // A view usable with Exl3LinearCpu / Exl3ReconstructFp16 (shares the tensors).
  Exl3Weight AsWeight() const;
};

// The global scale that minimizes the MSE of i.i.d. Gaussian tiles at the codebook's RMS, per K.
double Exl3DefaultGlobalScale(int K);

// weight: [out_features, in_features] row-major (nn.Linear layout), fp32.
Exl3QuantizedLinear QuantizeExl3Linear(const float* weight, int64_t out_features, int64_t in_features,
                                       const Exl3QuantOptions& options);

// Encodes k x n "ideal basis" targets (already rotated and normalized, row-major, k and n multiples of 16)
// tile by tile; writes the packed trellis [k/16, n/16, 16K] and returns the total squared error.
// Parallel over tiles; progress as above.
double EncodeExl3Tiles(const float* w, int64_t k, int64_t n, int K, Exl3Codebook codebook, uint16_t* trellis,
                       const std::function<void(int64_t, int64_t)>& progress = nullptr);

}  // namespace dsmesh

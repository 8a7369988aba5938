// exl3_logits_kl REF.safetensors TEST.safetensors: KL(softmax(ref) || softmax(test)) per token between
// two `dsmesh logits` outputs ("logits" f32 [tokens, vocab]), in nats, computed in fp64; also the top-1
// agreement. Used to measure what EXL3 quantization costs a model (kernels/exl3/measure_kl.sh).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

#include "common/safetensors.h"

int main(int argc, char** argv) {
  using namespace dsmesh;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s REF.safetensors TEST.safetensors\n", argv[0]);
    return 2;
  }
  try {
    const auto ref_file = SafetensorsFile::Open(argv[1]), test_file = SafetensorsFile::Open(argv[2]);
    const Tensor ref = ref_file->Get("logits"), test = test_file->Get("logits");
    if (ref.dtype != DType::kF32 || test.dtype != DType::kF32 || ref.shape != test.shape || ref.shape.size() != 2)
      throw std::runtime_error(std::string("logits must be F32 [tokens, vocab] of one shape; got ") + ref.ShapeString() +
                               " in " + argv[1] + " and " + test.ShapeString() + " in " + argv[2]);
    const int64_t tokens = ref.shape[0], vocab = ref.shape[1];
    double sum = 0, worst = 0, entropy = 0;
    int64_t agree = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      const float* p = ref.as<float>() + t * vocab;
      const float* q = test.as<float>() + t * vocab;
      const double pm = *std::max_element(p, p + vocab), qm = *std::max_element(q, q + vocab);
      double pz = 0, qz = 0;
      for (int64_t v = 0; v < vocab; ++v) pz += std::exp(p[v] - pm), qz += std::exp(q[v] - qm);
      const double lp = std::log(pz) + pm, lq = std::log(qz) + qm;
      double kl = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        const double a = p[v] - lp, b = q[v] - lq;
        kl += std::exp(a) * (a - b);
        entropy -= std::exp(a) * a;
      }
      sum += kl;
      worst = std::max(worst, kl);
      agree += (std::max_element(p, p + vocab) - p) == (std::max_element(q, q + vocab) - q);
    }
    std::printf("tokens %lld  mean KL %.6f nats/token  max %.6f  top-1 agreement %.1f%%  (reference entropy %.3f nats)\n",
                static_cast<long long>(tokens), sum / tokens, worst, 100.0 * agree / tokens, entropy / tokens);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exl3_logits_kl: %s\n", e.what());
    return 1;
  }
}

#include "model/testing/synthetic.h"

#include <stdexcept>

#include "kernels/exl3/synthetic_hash.h"
#include "model/v4_flash_config.h"

namespace dsmesh {

ModelConfig SyntheticConfig(const SyntheticSpec& spec) {
  if (spec.base == "v4-flash") return ModelConfig::FromJson(kV4FlashConfigJson, "synthetic:v4-flash (docs/model-v4.md)");
  return ModelConfig::FromDirectory(spec.base);
}

uint64_t SyntheticSeed(const SyntheticSpec& spec, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return SyntheticMix(spec.seed ^ h);
}

}  // namespace dsmesh

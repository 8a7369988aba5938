#include "kernels/exl3/pack_size.h"

#include <cstdio>

#include "kernels/exl3/quant_plan.h"

namespace dsmesh {

const char* PackClassName(PackClass c) {
  switch (c) {
    case PackClass::kExperts: return "experts";
    case PackClass::kDense: return "dense";
    case PackClass::kHead: return "head";
    case PackClass::kEmbedding: return "embedding";
    case PackClass::kOther: break;
  }
  return "other";
}

PackClass PackClassOf(const std::string& name) {
  if (name.rfind("embed.", 0) == 0) return PackClass::kEmbedding;
  if (name.rfind("head.", 0) == 0) return PackClass::kHead;
  // The linear's prefix, then the plan's class of `prefix.weight` with every class switched on.
  std::string prefix = name;
  for (const char* suffix : {".weight", ".trellis", ".suh", ".svh", ".mcg", ".mul1", ".bias", ".scale"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      prefix = name.substr(0, name.size() - s.size());
      break;
    }
  }
  Exl3BitsSpec all;
  all.experts = all.dense = 1;
  switch (PlanExl3Tensor(prefix + ".weight", all).cls) {
    case Exl3TensorClass::kRoutedExpert: return PackClass::kExperts;
    case Exl3TensorClass::kDense: return PackClass::kDense;
    default: return PackClass::kOther;
  }
}

int64_t PackBytes::total() const {
  int64_t t = 0;
  for (int64_t b : by_class) t += b;
  return t;
}

std::string PackBytes::ToString() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.2f MB:", total() / 1e6);
  std::string s = buf;
  for (int c = 0; c < kPackClasses; ++c) {
    std::snprintf(buf, sizeof buf, "%s %s %.2f MB", c ? "," : "", PackClassName(static_cast<PackClass>(c)),
                  by_class[c] / 1e6);
    s += buf;
  }
  return s;
}

int64_t Exl3LinearBytes(int64_t out_features, int64_t in_features, int K, Exl3Codebook codebook) {
  const int64_t k = (in_features + 127) / 128 * 128, n = (out_features + 127) / 128 * 128;
  return k * n * K / 8 + 2 * (k + n) + (codebook == Exl3Codebook::k3Inst ? 0 : 4);
}

}  // namespace dsmesh

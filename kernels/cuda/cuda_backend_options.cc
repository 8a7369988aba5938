// How the CLI and the worker choose a CUDA backend: the --device flag, and the one place the backend's A/B
// variants are read from the environment (CudaBackendOptionsFromEnvironment); tests set
// CudaBackendOptions directly.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_backend_options.h"

#include "common/flags.h"
#include "kernels/cuda/exl3_moe_params.h"

namespace dsmesh {
namespace {

// The variable's value, or "" when unset.
std::string EnvValue(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

[[noreturn]] void UnknownValue(const char* name, const std::string& value, const char* expected) {
  throw std::runtime_error(std::string(name) + "=" + value + ": expected " + expected);
}

// An on/off variable: 1 or on, 0 or off; unset keeps *value.
void EnvSwitch(const char* name, bool* value) {
  const std::string v = EnvValue(name);
  if (v == "1" || v == "on") {
    *value = true;
  } else if (v == "0" || v == "off") {
    *value = false;
  } else if (!v.empty()) {
    UnknownValue(name, v, "1 or on, 0 or off");
  }
}

}  // namespace

int ParseDeviceFlag(const std::string& value, const std::string& flag) {
  if (value == "cpu") return -1;
  if (value == "cuda") return 0;
  if (value.rfind("cuda:", 0) == 0) {
    const std::string n = value.substr(5);
    if (!n.empty() && n.size() < 4 && n.find_first_not_of("0123456789") == std::string::npos) return std::stoi(n);
  }
  throw std::runtime_error(flag + " " + value + ": expected cpu, cuda or cuda:N");
}

CudaBackendOptions CudaBackendOptionsFromEnvironment(CudaBackendOptions options) {
  using PrefillMoe = CudaBackendOptions::PrefillMoe;
  using PrefillAttention = CudaBackendOptions::PrefillAttention;
  EnvSwitch("DSMESH_CUDA_STATEFUL_GRAPHS", &options.stateful_graphs);
  EnvSwitch("DSMESH_CUDA_BLOCK_GRAPHS", &options.block_graphs);
  EnvSwitch("DSMESH_CUDA_PDL", &options.pdl);
  const std::string moe = EnvValue("DSMESH_CUDA_PREFILL_MOE");
  if (moe == "per-expert") {
    options.prefill_moe = PrefillMoe::kPerExpert;
  } else if (moe == "row-slices") {
    options.prefill_moe = PrefillMoe::kRowSlices;
  } else if (moe == "sorted-pairs") {
    options.prefill_moe = PrefillMoe::kSortedPairs;
  } else if (!moe.empty()) {
    UnknownValue("DSMESH_CUDA_PREFILL_MOE", moe, "sorted-pairs, per-expert or row-slices");
  }
  const std::string attention = EnvValue("DSMESH_CUDA_PREFILL_ATTENTION");
  if (attention == "per-row") {
    options.prefill_attention = PrefillAttention::kPerRow;
  } else if (attention == "split") {
    options.prefill_attention = PrefillAttention::kSplit;
  } else if (attention == "mma-fp16") {
    options.prefill_attention = PrefillAttention::kMmaFp16;
  } else if (attention == "mma") {
    options.prefill_attention = PrefillAttention::kMma;
  } else if (!attention.empty()) {
    UnknownValue("DSMESH_CUDA_PREFILL_ATTENTION", attention, "mma, mma-fp16, split or per-row");
  }
  options.gemv = Exl3GemvTuningFromEnvironment(options.gemv);
  options.moe = Exl3MoeTuningFromEnvironment(options.moe);
  return options;
}

Exl3GemvTuning Exl3GemvTuningFromEnvironment(Exl3GemvTuning t) {
  t.ctas_per_sm = EnvInt("DSMESH_EXL3_GEMV_CTAS_PER_SM", 1, 16, t.ctas_per_sm);
  return t;
}

Exl3MoeTuning Exl3MoeTuningFromEnvironment(Exl3MoeTuning t) {
  t.items_per_sm = EnvInt("DSMESH_EXL3_MOE_ITEMS_PER_SM", 1, 64, t.items_per_sm);
  t.down_wide = EnvInt("DSMESH_EXL3_MOE_DOWN_WIDE", -1, 1, t.down_wide);
  t.fused_finish = EnvInt("DSMESH_EXL3_MOE_FUSED_FINISH", -1, 1, t.fused_finish);
  t.splits = EnvInt("DSMESH_EXL3_MOE_SPLITS", 0, exl3cuda::kMoeMaxHiddenBlocks, t.splits);
  return t;
}

std::string CudaBackendVariants(const CudaBackendOptions& options) {
  using PrefillMoe = CudaBackendOptions::PrefillMoe;
  using PrefillAttention = CudaBackendOptions::PrefillAttention;
  std::string out;
  const PrefillAttention attention = options.prefill_attention;
  if (options.prefill_moe != PrefillMoe::kSortedPairs || attention != PrefillAttention::kMma)
    out = std::string("prefill chunks:") +
          (options.prefill_moe == PrefillMoe::kPerExpert ? " routed experts per expert" : "") +
          (options.prefill_moe == PrefillMoe::kRowSlices ? " routed experts on slices of rows" : "") +
          (attention == PrefillAttention::kPerRow    ? " attention one block per (row, head)"
           : attention == PrefillAttention::kSplit   ? " attention split over keys (16-row slices)"
           : attention == PrefillAttention::kMmaFp16 ? " attention on tensor cores with fp16 operands"
                                                     : "");
  if (!options.stateful_graphs) out += std::string(out.empty() ? "" : "; ") + "stateful segments run eagerly";
  if (options.block_graphs) out += std::string(out.empty() ? "" : "; ") + "one graph per decode block";
  if (options.pdl) out += std::string(out.empty() ? "" : "; ") + "programmatic dependent launch";
  return out;
}

}  // namespace dsmesh

#include "kernels/exl3/quant_plan.h"

#include <regex>
#include <sstream>
#include <stdexcept>

namespace dsmesh {

Exl3BitsSpec Exl3BitsSpec::Parse(const std::string& text) {
  Exl3BitsSpec spec;
  std::stringstream ss(text);
  std::string item;
  const std::regex item_re(R"((experts|dense|mtp|head|layer\.(\d+))=(\d+))");
  while (std::getline(ss, item, ',')) {
    std::smatch m;
    if (item == "embed=fp8" || item == "embed=bf16") {
      spec.embed_fp8 = item == "embed=fp8";
      continue;
    }
    if (item.rfind("embed=", 0) == 0)
      throw std::invalid_argument("--bits: '" + item + "': the embedding is stored as fp8 or bf16 (embed=fp8 or embed=bf16)");
    if (!std::regex_match(item, m, item_re))
      throw std::invalid_argument("--bits: cannot parse '" + item +
                                  "' (expected experts=K, dense=K, layer.N=K, mtp=K, head=K or embed=fp8)");
    const int K = std::stoi(m[3]);
    if (K < 1 || K > 8) throw std::invalid_argument("--bits: '" + item + "': K must be 1..8");
    const std::string key = m[1];
    if (key == "experts") spec.experts = K;
    else if (key == "dense") spec.dense = K;
    else if (key == "mtp") spec.mtp = K;
    else if (key == "head") spec.head = K;
    else spec.layer[std::stoi(m[2])] = K;
  }
  if (spec.experts == 0 || spec.dense == 0)
    throw std::invalid_argument("--bits '" + text + "': both experts=K and dense=K are required");
  return spec;
}

std::string Exl3BitsSpec::ToString() const {
  std::string s = "experts=" + std::to_string(experts) + ",dense=" + std::to_string(dense);
  for (auto [l, K] : layer) s += ",layer." + std::to_string(l) + "=" + std::to_string(K);
  if (mtp) s += ",mtp=" + std::to_string(*mtp);
  if (head) s += ",head=" + std::to_string(head);
  if (embed_fp8) s += ",embed=fp8";
  return s;
}

Exl3TensorPlan PlanExl3Tensor(const std::string& name, const Exl3BitsSpec& bits) {
  static const std::regex expert_re(R"((layers|mtp)\.(\d+)\.ffn\.experts\.\d+\.(w1|w2|w3)\.weight)");
  static const std::regex dense_re(
      R"((layers|mtp)\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|compressor\.wkv|compressor\.wgate|indexer\.wq_b|)"
      R"(indexer\.compressor\.wkv|indexer\.compressor\.wgate)|ffn\.shared_experts\.(w1|w2|w3))\.weight)");
  Exl3TensorPlan plan;
  std::smatch m;
  if (std::regex_match(name, m, expert_re)) {
    plan.cls = Exl3TensorClass::kRoutedExpert;
    plan.K = bits.experts;
    if (m[1] == "mtp" && bits.mtp) plan.K = *bits.mtp;
    if (m[1] == "layers") {
      auto it = bits.layer.find(std::stoi(m[2]));
      if (it != bits.layer.end()) plan.K = it->second;
    }
  } else if (std::regex_match(name, dense_re)) {
    plan.cls = Exl3TensorClass::kDense;
    plan.K = bits.dense;
  } else if (name == "head.weight") {
    plan.cls = Exl3TensorClass::kHead;
    plan.K = bits.head;
  } else {
    return plan;
  }
  if (plan.K == 0) return Exl3TensorPlan{};
  plan.prefix = name.substr(0, name.size() - std::string(".weight").size());
  return plan;
}

std::string ModuleOf(const std::string& name) {
  static const std::regex module_re(R"(((layers|mtp)\.\d+)\..*)");
  std::smatch m;
  if (std::regex_match(name, m, module_re)) return m[1];
  return "";
}

}  // namespace dsmesh

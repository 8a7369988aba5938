#include "kernels/exl3/quantize_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "common/fp8_blocks.h"
#include "common/safetensors.h"
#include "kernels/exl3/parallel.h"
#include "kernels/exl3/progress.h"
#include "kernels/exl3/quantize_linear.h"

namespace dsmesh {
namespace fs = std::filesystem;
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("quantize: cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  if (!out.flush()) throw std::runtime_error("quantize: cannot write " + p.string());
}

// Shards fill in module order and close when the next module would overflow them.
class ShardSet {
 public:
  ShardSet(fs::path dir, int64_t limit) : dir_(std::move(dir)), limit_(limit) {}
  void BeginModule(int64_t module_bytes) {
    if (current_bytes_ > 0 && current_bytes_ + module_bytes > limit_) Flush();
  }
  void Add(const std::string& name, const Tensor& t) {
    writer_.Add(name, t);
    current_bytes_ += t.nbytes();
    total_bytes_ += t.nbytes();
    by_class_.Add(PackClassOf(name), t.nbytes());
    pending_names_.push_back(name);
  }
  const PackBytes& bytes() const { return by_class_; }
  // Writes the last shard and names them model.safetensors or model-0000i-of-0000N.safetensors (+ index).
  int Finish() {
    Flush();
    const int n = static_cast<int>(written_.size());
    nlohmann::json index;
    index["metadata"]["total_size"] = total_bytes_;
    for (int i = 0; i < n; ++i) {
      char name[64];
      if (n == 1) std::snprintf(name, sizeof name, "model.safetensors");
      else std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, n);
      fs::rename(written_[i].first, dir_ / name);
      for (const std::string& t : written_[i].second) index["weight_map"][t] = name;
    }
    if (n > 1) WriteFile(dir_ / "model.safetensors.index.json", index.dump(2) + "\n");
    return n;
  }

 private:
  void Flush() {
    if (pending_names_.empty()) return;
    const fs::path tmp = dir_ / ("shard-" + std::to_string(written_.size()) + ".partial");
    writer_.SetMetadata("format", "pt");
    writer_.Write(tmp.string());
    written_.emplace_back(tmp, pending_names_);
    writer_ = SafetensorsWriter();
    pending_names_.clear();
    current_bytes_ = 0;
  }
  fs::path dir_;
  int64_t limit_;
  SafetensorsWriter writer_;
  std::vector<std::string> pending_names_;
  int64_t current_bytes_ = 0, total_bytes_ = 0;
  PackBytes by_class_;
  std::vector<std::pair<fs::path, std::vector<std::string>>> written_;
};

Tensor MarkerTensor(uint32_t value) {
  Tensor t = AllocateTensor(DType::kI32, {});
  *t.as<uint32_t>() = value;
  return t;
}

void BuildPack(const QuantizeCheckpointOptions& opt, const fs::path& tmp, QuantizeCheckpointSummary* summary) {
  const fs::path in_dir(opt.model_dir);
  const fs::path config_path = in_dir / "config.json";
  if (!fs::exists(config_path)) throw std::runtime_error("quantize: " + config_path.string() + " not found");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(ReadFile(config_path));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("quantize: " + config_path.string() + ": " + e.what());
  }
  const Checkpoint ckpt = Checkpoint::Open(opt.model_dir);
  const std::vector<std::string> names = ckpt.names();

  // Plan and validate everything before the slow part.
  std::map<std::string, std::vector<std::string>> modules;  // module -> tensor names (sorted)
  std::map<std::string, Exl3TensorPlan> plans;
  int64_t total_tiles = 0;
  for (const std::string& name : names) {
    if (name.rfind("model.", 0) == 0 || name == "lm_head.weight")
      throw std::runtime_error("quantize: " + ckpt.FileOf(name) + ": tensor \"" + name +
                               "\" uses transformers naming; quantize expects the DeepSeek checkpoint naming "
                               "(layers.N.attn.wq_a.weight, embed.weight, ...)");
    const Exl3TensorPlan plan = PlanExl3Tensor(name, opt.bits);
    if (plan.cls != Exl3TensorClass::kKeep) {
      const Tensor t = ckpt.Get(name);
      if (t.dtype != DType::kBF16 && t.dtype != DType::kF16 && t.dtype != DType::kF32)
        throw std::runtime_error("quantize: " + ckpt.FileOf(name) + ": tensor \"" + name + "\" has dtype " +
                                 DTypeName(t.dtype) + "; expected BF16, F16 or F32 (FP8/FP4 checkpoints must be "
                                 "dequantized first)");
      if (t.shape.size() != 2)
        throw std::runtime_error("quantize: " + ckpt.FileOf(name) + ": tensor \"" + name + "\" has shape " +
                                 t.ShapeString() + ", expected a 2-D [out, in] linear weight");
      if (ckpt.Has(plan.prefix + ".scale"))
        throw std::runtime_error("quantize: " + ckpt.FileOf(name) + ": \"" + plan.prefix +
                                 ".scale\" exists: block-scaled FP8/FP4 weights must be dequantized first");
      total_tiles += ((t.shape[1] + 127) / 128 * 8) * ((t.shape[0] + 127) / 128 * 8);
    }
    if (name == "embed.weight" && opt.bits.embed_fp8) {
      const Tensor t = ckpt.Get(name);
      if (t.shape.size() != 2 || (t.dtype != DType::kBF16 && t.dtype != DType::kF16 && t.dtype != DType::kF32 &&
                                  t.dtype != DType::kF8E4M3))
        throw std::runtime_error("quantize: " + ckpt.FileOf(name) + ": tensor \"embed.weight\" is " +
                                 DTypeName(t.dtype) + " " + t.ShapeString() +
                                 "; embed=fp8 needs a 2-D BF16, F16 or F32 table");
      if (t.dtype == DType::kF8E4M3 && !ckpt.Has("embed.scale"))
        throw std::runtime_error("quantize: " + ckpt.FileOf(name) + ": tensor \"embed.weight\" is F8_E4M3 without "
                                 "\"embed.scale\"");
    }
    plans[name] = plan;
    modules[ModuleOf(name)].push_back(name);
  }
  if (total_tiles == 0 && !(opt.bits.embed_fp8 && ckpt.Has("embed.weight")))
    throw std::runtime_error("quantize: " + opt.model_dir + " has no linear weights in DeepSeek naming to quantize");

  // The pack's size by class, from the plan and the shapes alone (what --size-only prints).
  for (const std::string& name : names) {
    const Exl3TensorPlan& plan = plans[name];
    const Tensor t = ckpt.Get(name);
    if (plan.cls != Exl3TensorClass::kKeep)
      summary->planned_bytes.Add(PackClassOf(name), Exl3LinearBytes(t.shape[0], t.shape[1], plan.K, opt.codebook));
    else if (name == "embed.weight" && opt.bits.embed_fp8 && t.dtype != DType::kF8E4M3)
      summary->planned_bytes.Add(PackClass::kEmbedding, t.numel() + t.shape[0] * 4);  // fp8 + f32 scale per row
    else
      summary->planned_bytes.Add(PackClassOf(name), t.nbytes());
  }
  if (opt.size_only) return;

  ShardSet shards(tmp, opt.shard_bytes);
  ProgressBar bar("quantize");
  int64_t tiles_before = 0;
  double weighted_bits = 0, weights = 0;
  nlohmann::json storage = nlohmann::json::object();
  // Modules in checkpoint order: non-layer tensors (embed, norms, head) first, then layers, then mtp.
  std::vector<std::string> order;
  if (modules.count("")) order.push_back("");
  for (const char* kind : {"layers.", "mtp."})
    for (int i = 0;; ++i) {
      const std::string key = kind + std::to_string(i);
      if (!modules.count(key)) break;
      order.push_back(key);
    }
  for (auto& [key, v] : modules)
    if (std::find(order.begin(), order.end(), key) == order.end()) order.push_back(key);

  for (const std::string& module : order) {
    std::vector<std::pair<std::string, Tensor>> out;  // this module's output tensors
    for (const std::string& name : modules[module]) {
      const Exl3TensorPlan& plan = plans[name];
      const Tensor src = ckpt.Get(name);
      if (plan.cls == Exl3TensorClass::kKeep) {
        if (name == "embed.weight" && opt.bits.embed_fp8 && src.dtype != DType::kF8E4M3) {
          const std::vector<float> w = ToFloatVector(src);
          Fp8RowQuantized q = QuantizeFp8Rows(w.data(), src.shape[0], src.shape[1]);
          out.emplace_back("embed.weight", q.weight);
          out.emplace_back("embed.scale", q.scale);
          storage["embed"] = {{"quant_format", "fp8_e4m3"}, {"scale", "per row, f32 power of two (embed.scale [rows, 1])"},
                              {"shape", src.shape}, {"source_dtype", DTypeName(src.dtype)}};
          ++summary->tensors_kept;
          continue;
        }
        out.emplace_back(name, src);
        ++summary->tensors_kept;
        continue;
      }
      const std::vector<float> w = ToFloatVector(src);
      Exl3QuantOptions qo;
      qo.K = plan.K;
      qo.codebook = opt.codebook;
      qo.seed = Fnv1a(name);
      if (opt.progress) qo.progress = [&](int64_t done, int64_t) { bar.Update(tiles_before + done, total_tiles); };
      const Exl3QuantizedLinear q = QuantizeExl3Linear(w.data(), src.shape[0], src.shape[1], qo);
      tiles_before += q.trellis.shape[0] * q.trellis.shape[1];
      out.emplace_back(plan.prefix + ".trellis", q.trellis);
      out.emplace_back(plan.prefix + ".suh", q.suh);
      out.emplace_back(plan.prefix + ".svh", q.svh);
      if (opt.codebook == Exl3Codebook::kMcg) out.emplace_back(plan.prefix + ".mcg", MarkerTensor(kExl3McgMultiplier));
      if (opt.codebook == Exl3Codebook::kMul1) out.emplace_back(plan.prefix + ".mul1", MarkerTensor(kExl3Mul1Multiplier));
      const double n_weights = double(src.shape[0]) * src.shape[1];
      weighted_bits += n_weights * plan.K;
      weights += n_weights;
      ++summary->tensors_quantized;
      nlohmann::json entry;
      entry["quant_format"] = "exl3";
      entry["bits_per_weight"] = plan.K;
      entry["tensor_class"] = plan.cls == Exl3TensorClass::kRoutedExpert ? "experts"
                              : plan.cls == Exl3TensorClass::kHead       ? "head"
                                                                         : "dense";
      entry["in_features"] = src.shape[1];
      entry["out_features"] = src.shape[0];
      entry["rotated_mse_over_var"] = q.stats.rotated_var > 0 ? q.stats.rotated_mse / q.stats.rotated_var : 0.0;
      entry["global_scale"] = q.stats.scale;
      if (opt.codebook == Exl3Codebook::kMcg) entry["mcg_multiplier"] = kExl3McgMultiplier;
      if (opt.codebook == Exl3Codebook::kMul1) entry["mul1_multiplier"] = kExl3Mul1Multiplier;
      for (auto [part, t] : {std::pair<const char*, const Tensor*>{".trellis", &q.trellis}, {".suh", &q.suh}, {".svh", &q.svh}})
        entry["stored_tensors"][plan.prefix + part] = {{"shape", t->shape}, {"n_bytes", t->nbytes()}, {"dtype", DTypeName(t->dtype)}};
      storage[plan.prefix] = entry;
    }
    int64_t module_bytes = 0;
    for (auto& [n, t] : out) module_bytes += t.nbytes();
    shards.BeginModule(module_bytes);
    for (auto& [n, t] : out) shards.Add(n, t);
  }
  if (opt.progress) bar.Finish();
  summary->bytes = shards.bytes();
  summary->shards = shards.Finish();
  for (const fs::directory_entry& e : fs::directory_iterator(tmp))
    if (e.path().extension() == ".safetensors") summary->file_bytes += static_cast<int64_t>(e.file_size());
  summary->tiles = total_tiles;
  summary->average_bits = weights > 0 ? weighted_bits / weights : 0;

  // config.json with the quantization record (a foreign block is kept as original_quantization_config).
  nlohmann::json qc;
  qc["quant_method"] = "exl3";
  qc["version"] = "dsmesh-exl3-1";
  qc["bits"] = std::round(summary->average_bits * 100) / 100;
  qc["head_bits"] = opt.bits.head ? opt.bits.head : 16;  // 16: the head kept as stored
  qc["embed_dtype"] = opt.bits.embed_fp8 ? "fp8_e4m3" : "as stored";
  qc["codebook"] = Exl3CodebookName(opt.codebook);
  qc["out_scales"] = "always";
  qc["calibration"] = nullptr;  // no calibration data: no Hessian, no LDLQ
  qc["ldlq"] = false;
  qc["bits_per_class"] = {{"experts", opt.bits.experts}, {"dense", opt.bits.dense}};
  for (auto [l, K] : opt.bits.layer) qc["bits_per_class"]["layer." + std::to_string(l)] = K;
  if (opt.bits.mtp) qc["bits_per_class"]["mtp"] = *opt.bits.mtp;
  if (opt.bits.head) qc["bits_per_class"]["head"] = opt.bits.head;
  qc["bits_spec"] = opt.bits.ToString();
  qc["kept_unquantized"] = std::string(opt.bits.embed_fp8 ? "" : "embeddings, ") + (opt.bits.head ? "" : "head, ") +
                           "norms, hc parameters, attention sinks, compressor position bias, "
                           "router gate/bias/tid2eid, indexer weights_proj, mtp e_proj/h_proj";
  qc["pack_bytes"] = {{"total", summary->bytes.total()}};
  for (int c = 0; c < kPackClasses; ++c)
    qc["pack_bytes"][PackClassName(static_cast<PackClass>(c))] = summary->bytes.by_class[c];
  if (config.contains("quantization_config") && !(config["quantization_config"].is_object() &&
                                                   config["quantization_config"].value("quant_method", "") == "exl3"))
    config["original_quantization_config"] = config["quantization_config"];
  config["quantization_config"] = qc;
  WriteFile(tmp / "config.json", config.dump(2) + "\n");
  nlohmann::json qfile = qc;
  qfile["tensor_storage"] = storage;
  WriteFile(tmp / "quantization_config.json", qfile.dump(2) + "\n");

  // Every other file (tokenizer, chat template, generation config, ...), directories included.
  for (const fs::directory_entry& e : fs::directory_iterator(in_dir)) {
    const std::string fname = e.path().filename().string();
    if (fname == "config.json" || fname == "quantization_config.json" || fname == "model.safetensors.index.json" ||
        e.path().extension() == ".safetensors")
      continue;
    fs::copy(e.path(), tmp / fname, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
}

}  // namespace

QuantizeCheckpointSummary QuantizeCheckpoint(const QuantizeCheckpointOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  if (opt.size_only) {
    if (opt.model_dir.empty()) throw std::runtime_error("quantize: --model is required");
    if (!fs::is_directory(opt.model_dir)) throw std::runtime_error("quantize: --model " + opt.model_dir + " is not a directory");
    QuantizeCheckpointSummary summary;
    BuildPack(opt, fs::path(), &summary);  // plans, validates and sizes; writes nothing
    summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return summary;
  }
  if (opt.model_dir.empty() || opt.out_dir.empty()) throw std::runtime_error("quantize: --model and --out are required");
  if (!fs::is_directory(opt.model_dir)) throw std::runtime_error("quantize: --model " + opt.model_dir + " is not a directory");
  const fs::path out = fs::absolute(opt.out_dir).lexically_normal();
  if (fs::weakly_canonical(opt.model_dir) == fs::weakly_canonical(out))
    throw std::runtime_error("quantize: --out must differ from --model");
  if (fs::exists(out) && !opt.force)
    throw std::runtime_error("quantize: " + out.string() + " already exists (pass --force to replace it)");
  fs::create_directories(out.parent_path());
  // The temporary directory is a sibling, so the final rename stays on one file system.
  const fs::path tmp = out.parent_path() / ("." + out.filename().string() + ".partial-" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  QuantizeCheckpointSummary summary;
  try {
    BuildPack(opt, tmp, &summary);
    if (fs::exists(out)) {
      const fs::path old = out.parent_path() / ("." + out.filename().string() + ".old-" + std::to_string(getpid()));
      fs::rename(out, old);
      fs::rename(tmp, out);
      fs::remove_all(old);
    } else {
      fs::rename(tmp, out);
    }
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace dsmesh

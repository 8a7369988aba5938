#include "model/weights.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "common/fp8_blocks.h"
#include "common/half.h"
#include "kernels/exl3/synthetic_hash.h"
#include "model/testing/synthetic.h"
#include "model/tensor_names.h"

namespace dsmesh {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool IsDenseFloat(DType t) { return t == DType::kBF16 || t == DType::kF16 || t == DType::kF32; }

// Rows [r0, r1) and columns [c0, c1) of a row-major 2-D tensor: a view when all columns are kept,
// else a packed copy.
Tensor Slice2D(const Tensor& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t cols = w.shape[1];
  const size_t es = DTypeSize(w.dtype);
  if (c0 == 0 && c1 == cols) {
    Tensor v = w;
    v.shape = {r1 - r0, cols};
    v.data = static_cast<char*>(w.data) + static_cast<size_t>(r0) * cols * es;
    return v;
  }
  Tensor out = AllocateTensor(w.dtype, {r1 - r0, c1 - c0});
  for (int64_t r = r0; r < r1; ++r)
    std::memcpy(static_cast<char*>(out.data) + (r - r0) * (c1 - c0) * es,
                static_cast<const char*>(w.data) + (r * cols + c0) * es, (c1 - c0) * es);
  return out;
}

// Matrix `index` of a 3-D tensor [n, rows, cols], as a 2-D view.
Tensor Matrix(const Tensor& t, int64_t index) {
  Tensor v = t;
  v.shape = {t.shape[1], t.shape[2]};
  v.data = static_cast<char*>(t.data) + static_cast<size_t>(index) * t.shape[1] * t.shape[2] * DTypeSize(t.dtype);
  return v;
}

// Uniform values of standard deviation `stddev` (a synthetic tensor's values; uniform keeps them bounded).
float SyntheticUniform(uint64_t seed, int64_t i, float stddev) {
  const double u = static_cast<double>(SyntheticMix(seed ^ (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull)) >> 11) *
                   (1.0 / 9007199254740992.0);
  return static_cast<float>((2.0 * u - 1.0) * 1.7320508075688772 * stddev);
}

// A synthetic dense tensor: matrices in bf16 (filled on all cores), small parameters in f32, by what the
// name says the tensor is: norms and hc scales 1, hc mixing weights small, biases, sinks and hc bases 0.
Tensor SyntheticDense(const SyntheticSpec& spec, const std::string& name, const std::vector<int64_t>& shape) {
  const uint64_t seed = SyntheticSeed(spec, name);
  auto ends = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  if (shape.size() == 2 && ends(".weight") && !ends("norm.weight")) {
    Tensor t = AllocateTensor(DType::kBF16, shape);
    const int64_t rows = shape[0], cols = shape[1];
    const float stddev = name.find("embed") != std::string::npos ? 1.0f : 1.0f / std::sqrt(static_cast<float>(cols));
    uint16_t* out = static_cast<uint16_t*>(t.data);
    const int threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w)
      pool.emplace_back([&, w] {
        for (int64_t r = w; r < rows; r += threads)
          for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = FloatToBf16(SyntheticUniform(seed, r * cols + c, stddev));
      });
    for (auto& th : pool) th.join();
    return t;
  }
  Tensor t = AllocateTensor(DType::kF32, shape);
  float* out = t.as<float>();
  float value = 0.0f, stddev = 0.0f;
  if (ends("norm.weight") || ends("scale")) value = 1.0f;
  else if (ends("fn")) stddev = 0.01f;
  else if (ends("ape")) stddev = 0.1f;
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = stddev > 0 ? SyntheticUniform(seed, i, stddev) : value;
  return t;
}

// tid2eid [vocab, k]: k distinct experts per token.
Tensor SyntheticTid2eid(const SyntheticSpec& spec, const std::string& name, int64_t vocab, int k, int experts) {
  Tensor t = AllocateTensor(DType::kI32, {vocab, k});
  int32_t* out = t.as<int32_t>();
  const uint64_t seed = SyntheticSeed(spec, name);
  for (int64_t v = 0; v < vocab; ++v)
    for (int i = 0; i < k; ++i) {
      uint64_t draw = SyntheticMix(seed ^ (static_cast<uint64_t>(v) * k + i));
      int32_t e = static_cast<int32_t>(draw % experts);
      for (bool clash = true; clash;) {  // distinct within the row
        clash = false;
        for (int j = 0; j < i; ++j) clash |= out[v * k + j] == e;
        if (clash) e = (e + 1) % experts;
      }
      out[v * k + i] = e;
    }
  return t;
}

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& ckpt, const ModelConfig& c, const ShardLayout& l, Backend& be,
               const SyntheticSpec* synth = nullptr)
      : ckpt_(ckpt), c_(c), l_(l), be_(be), synth_(synth) {}

  // A whole dense tensor: the checkpoint's (shape checked by the caller), or the synthetic one.
  Tensor Fetch(const std::string& ds, const std::vector<int64_t>& shape) const {
    if (synth_) return SyntheticDense(*synth_, ds, shape);
    return Raw(ds);
  }

  size_t bytes() const { return bytes_; }
  int exl3_linears() const { return exl3_linears_; }
  int dense_linears() const { return dense_linears_; }
  int head_bits() const { return head_bits_; }

  // The embedding table [V, D] as a dense float tensor: as stored, or an F8_E4M3 table with its block
  // scale (`embed.scale`, or `embed.weight_scale_inv`) dequantized to bf16. `*storage` says which.
  Tensor Embedding(int64_t V, int64_t D, std::string* storage) const {
    Tensor embed = Fetch("embed.weight", {V, D});
    CheckShape(embed, {V, D}, "embed.weight");
    *storage = DTypeName(embed.dtype);
    if (IsDenseFloat(embed.dtype)) return embed;
    const std::string file = ckpt_.FileOf(Find("embed.weight"));
    if (embed.dtype != DType::kF8E4M3)
      throw std::runtime_error(file + ": tensor \"embed.weight\" has dtype " + DTypeName(embed.dtype) +
                               ", expected bf16/fp16/f32, or F8_E4M3 with a scale");
    std::string scale_name;
    for (const char* n : {"embed.scale", "embed.weight_scale_inv", "model.embed_tokens.weight_scale_inv"})
      if (scale_name.empty()) scale_name = Find(n);
    if (scale_name.empty())
      throw std::runtime_error(file + ": tensor \"embed.weight\" is F8_E4M3 but the checkpoint has no scale for it "
                               "(\"embed.scale\" or \"embed.weight_scale_inv\")");
    const Tensor scale = ckpt_.Get(scale_name);
    *storage += " + " + std::string(DTypeName(scale.dtype)) + " scale " + scale.ShapeString() + " (dequantized to BF16)";
    return DequantizeFp8ToBf16(embed, scale, ckpt_.FileOf(scale_name) + ": \"embed.weight\" with \"" + scale_name + "\"");
  }

  // The stored name of a DeepSeek-named tensor, or "" when the checkpoint has it under no known spelling.
  std::string Find(const std::string& ds) const {
    if (ckpt_.Has(ds)) return ds;
    std::string hf = TransformersName(ds);
    if (!hf.empty() && ckpt_.Has(hf)) return hf;
    if (ckpt_.Has("model." + ds)) return "model." + ds;
    // transformers' save_pretrained writes the attention's kv_norm as `attn.norm` (DeepSeek: `attn.kv_norm`).
    static const std::string kKvNorm = ".attn.kv_norm.weight";
    if (ds.size() > kKvNorm.size() && ds.compare(ds.size() - kKvNorm.size(), kKvNorm.size(), kKvNorm) == 0) {
      std::string alt = ds.substr(0, ds.size() - kKvNorm.size()) + ".attn.norm.weight";
      if (ckpt_.Has(alt)) return alt;
      if (ckpt_.Has("model." + alt)) return "model." + alt;
    }
    return "";
  }
  bool Has(const std::string& ds) const { return synth_ || !Find(ds).empty(); }

  Tensor Raw(const std::string& ds) const {
    std::string name = Find(ds);
    if (name.empty()) {
      std::string hf = TransformersName(ds);
      throw std::runtime_error(ckpt_.dir() + ": missing tensor \"" + ds + "\"" +
                               (hf.empty() ? "" : " (transformers name \"" + hf + "\")"));
    }
    return ckpt_.Get(name);
  }

  void CheckShape(const Tensor& t, const std::vector<int64_t>& want, const std::string& ds) const {
    if (t.shape != want)
      throw std::runtime_error(ckpt_.dir() + ": tensor \"" + ds + "\" has shape " + ShapeStr(t.shape) +
                               ", config implies " + ShapeStr(want));
  }

  // A small parameter (norm weight, hc, sink, bias, ape) as f32 in backend memory; [b, e) of dim 0.
  Tensor F32(const std::string& ds, const std::vector<int64_t>& shape, int64_t b = 0, int64_t e = -1) {
    Tensor t = Fetch(ds, shape);
    CheckShape(t, shape, ds);
    if (!IsDenseFloat(t.dtype))
      throw std::runtime_error(ckpt_.dir() + ": tensor \"" + ds + "\" has dtype " + DTypeName(t.dtype) +
                               ", expected a float type");
    if (e < 0) e = shape[0];
    std::vector<float> all = ToFloatVector(t);
    int64_t inner = shape.empty() ? 1 : t.numel() / shape[0];
    std::vector<int64_t> out_shape = shape;
    if (!out_shape.empty()) out_shape[0] = e - b;
    Tensor out = AllocateTensor(DType::kF32, out_shape);
    std::memcpy(out.data, all.data() + b * inner, static_cast<size_t>((e - b) * inner) * sizeof(float));
    bytes_ += out.nbytes();
    return be_.Upload(out);
  }

  Tensor Int32(const std::string& ds, const std::vector<int64_t>& shape) {
    Tensor t = synth_ ? SyntheticTid2eid(*synth_, ds, shape[0], static_cast<int>(shape[1]), c_.n_routed_experts)
                      : Raw(ds);
    CheckShape(t, shape, ds);
    Tensor out = AllocateTensor(DType::kI32, shape);
    int32_t* o = out.as<int32_t>();
    const int64_t n = t.numel();
    switch (t.dtype) {
      case DType::kI32: std::memcpy(o, t.data, n * 4); break;
      case DType::kI64: for (int64_t i = 0; i < n; ++i) o[i] = static_cast<int32_t>(t.as<int64_t>()[i]); break;
      case DType::kI16: for (int64_t i = 0; i < n; ++i) o[i] = t.as<int16_t>()[i]; break;
      case DType::kU8: for (int64_t i = 0; i < n; ++i) o[i] = t.as<uint8_t>()[i]; break;
      default:
        throw std::runtime_error(ckpt_.dir() + ": tensor \"" + ds + "\" has dtype " + DTypeName(t.dtype) +
                                 ", expected an integer type");
    }
    bytes_ += out.nbytes();
    return out;  // host memory: routing tables are read on the host
  }

  // A dense view/copy of a [out, in] weight already fetched, sliced to rows [r0, r1), cols [c0, c1).
  LinearWeight DenseLinear(const std::string& label, const Tensor& w, int64_t r0, int64_t r1, int64_t c0,
                           int64_t c1) {
    if (!IsDenseFloat(w.dtype))
      throw std::runtime_error(ckpt_.dir() + ": tensor \"" + label + "\" has dtype " + DTypeName(w.dtype) +
                               (w.dtype == DType::kF8E4M3
                                    ? ": FP8 checkpoints are not supported (use a bf16 or EXL3 checkpoint)"
                                    : ", expected bf16/fp16/f32 or an EXL3 tensor set"));
    LinearWeight lw;
    lw.name = label;
    lw.out = r1 - r0;
    lw.in = c1 - c0;
    lw.dense = be_.Upload(Slice2D(w, r0, r1, c0, c1));
    bytes_ += lw.dense.nbytes();
    ++dense_linears_;
    return lw;
  }

  // A linear `<prefix>.weight` [out, in] (dense) or `<prefix>.trellis...` (EXL3), sliced for this rank.
  LinearWeight Linear(const std::string& prefix, int64_t out, int64_t in, int64_t r0 = 0, int64_t r1 = -1,
                      int64_t c0 = 0, int64_t c1 = -1) {
    if (r1 < 0) r1 = out;
    if (c1 < 0) c1 = in;
    std::string ds = prefix + ".weight";
    if (synth_) {
      const Exl3TensorPlan plan = PlanExl3Tensor(ds, synth_->bits);
      if (plan.cls == Exl3TensorClass::kKeep) return DenseLinear(ds, SyntheticDense(*synth_, ds, {out, in}), r0, r1, c0, c1);
      LinearWeight lw = be_.SyntheticExl3Linear(prefix, out, in, r0, r1, c0, c1, plan.K, SyntheticSeed(*synth_, ds));
      ++exl3_linears_;
      if (prefix == "head") head_bits_ = plan.K;
      const int64_t k = (c1 + 127) / 128 * 128 - c0 / 128 * 128, n = (r1 + 127) / 128 * 128 - r0 / 128 * 128;
      bytes_ += static_cast<size_t>(k * n * plan.K / 8 + 2 * (k + n));
      return lw;
    }
    if (!Has(ds)) {
      // EXL3 packs keep DeepSeek names, possibly under a "model." prefix.
      for (const std::string& p : {prefix, "model." + prefix}) {
        if (!ckpt_.Has(p + ".trellis")) continue;
        LinearWeight lw = be_.LoadExl3Linear(ckpt_, p, out, in, r0, r1, c0, c1);
        lw.name = p;
        ++exl3_linears_;
        if (prefix == "head") {
          const Tensor trellis = ckpt_.Get(p + ".trellis");  // [k/16, n/16, 16K] (validated by the backend)
          head_bits_ = static_cast<int>(trellis.shape.at(2) / 16);
        }
        return lw;
      }
    }
    Tensor w = Raw(ds);
    CheckShape(w, {out, in}, ds);
    return DenseLinear(ds, w, r0, r1, c0, c1);
  }

  // Rows [r0, r1) of the lm head: `head.weight` (dense) or `head.trellis...` (EXL3), or the embedding when
  // the checkpoint ties them (`embed`: the table already fetched, or null to fetch it).
  LinearWeight Head(int64_t r0, int64_t r1, const Tensor* embed) {
    const int64_t V = c_.vocab_size, D = c_.hidden_size;
    if (Has("head.weight") || ckpt_.Has("head.trellis") || ckpt_.Has("model.head.trellis"))
      return Linear("head", V, D, r0, r1);
    if (!c_.tie_word_embeddings) Raw("head.weight");  // throws naming the missing tensor
    // transformers may tie lm_head to the embedding (tie_word_embeddings) and then saves only the latter.
    std::string storage;
    const Tensor table = embed ? *embed : Embedding(V, D, &storage);
    return DenseLinear("embed.weight (tied head)", table, r0, r1, 0, D);
  }

  // A linear with a bias `<prefix>.bias` [out]; rows [r0, r1) of both. (An EXL3 linear brings its own bias.)
  LinearWeight BiasedLinear(const std::string& prefix, int64_t out, int64_t in, int64_t r0 = 0, int64_t r1 = -1) {
    if (r1 < 0) r1 = out;
    LinearWeight lw = Linear(prefix, out, in, r0, r1);
    if (!lw.is_exl3()) lw.bias = F32(prefix + ".bias", {out}, r0, r1);
    return lw;
  }

  // The ViT, the aligner and the sentinel embeddings (names as vLLM's vl_model.py / vision.py load them
  // from the checkpoint: vision.*, aligner.*, image_*), every size from the vision_* config keys; the
  // blocks and the aligner as this rank's shard of them (ShardLayout's vision_* and aligner_* fields).
  VisionWeights Vision() {
    const VisionConfig& v = c_.vision;
    const int64_t dim = v.dim, H = c_.hidden_size;
    const int64_t patch_in = 3LL * v.patch_size * v.patch_size;
    const int64_t merged = dim * v.downsample_ratio * v.downsample_ratio;
    const size_t bytes_before = bytes_;
    VisionWeights w;
    w.tower_world = l_.vision_world;
    w.local_heads = v.n_heads / l_.vision_world;
    w.aligner_world = l_.aligner_world;
    LogVisionFallback();
    w.patch_embed = BiasedLinear("vision.patch_embed.proj", dim, patch_in);
    for (int i = 0; i < v.n_layers; ++i) w.blocks.push_back(VisionBlock("vision.blocks." + std::to_string(i) + "."));
    w.norm = F32("vision.norm.weight", {dim});
    // Aligner: w1 column-parallel (the rank's hidden rows and their bias), w2 row-parallel (the matching
    // input columns, bias on the split's rank 0); GELU between them is elementwise.
    const int64_t a0 = l_.aligner_rank * (H / l_.aligner_world), a1 = a0 + H / l_.aligner_world;
    w.aligner_w1 = BiasedLinear("aligner.w1", H, merged, a0, a1);
    w.aligner_w2 = RowParallelBiasedLinear("aligner.w2", H, H, a0, a1, l_.aligner_rank == 0);
    w.image_start = F32("image_start", {H});
    w.image_pad = F32("image_pad", {H});
    w.image_newline = F32("image_newline", {H});
    w.image_end = F32("image_end", {H});
    w.bytes = bytes_ - bytes_before;
    return w;
  }

  // Says on stderr which part of the tower stays whole on every rank of a tensor-parallel world because
  // its sizes do not divide by the world (the language model's rule: even splits only).
  void LogVisionFallback() const {
    const VisionConfig& v = c_.vision;
    if (l_.world > 1 && l_.vision_world == 1 && l_.rank == 0)
      std::fprintf(stderr,
                   "[load] vision tower: vision_n_heads %d or vision_inter_dim %d does not divide by the "
                   "tensor-parallel world %d; the ViT blocks are replicated on every rank\n",
                   v.n_heads, v.inter_dim, l_.world);
    if (l_.world > 1 && l_.aligner_world == 1 && l_.rank == 0)
      std::fprintf(stderr,
                   "[load] vision aligner: hidden_size %lld does not divide by the tensor-parallel world %d; "
                   "the aligner is replicated on every rank\n",
                   static_cast<long long>(c_.hidden_size), l_.world);
  }

  // One ViT block's shard: heads [h0, h1) of wqkv's q, k and v thirds and of wo's input columns, SwiGLU
  // columns [i0, i1) of the fused mlp.w1's gate and up halves and of mlp.w2's input columns.
  VisionBlockWeights VisionBlock(const std::string& p) {
    const VisionConfig& v = c_.vision;
    const int64_t dim = v.dim, I = v.inter_dim, hd = v.head_dim();
    const int64_t lh = v.n_heads / l_.vision_world, li = I / l_.vision_world;
    const int64_t q0 = l_.vision_rank * lh * hd, q1 = q0 + lh * hd;
    const int64_t i0 = l_.vision_rank * li, i1 = i0 + li;
    VisionBlockWeights b;
    b.norm1 = F32(p + "norm1.weight", {dim});
    b.norm2 = F32(p + "norm2.weight", {dim});
    b.wq = BiasedLinear(p + "attn.wqkv", 3 * dim, dim, q0, q1);
    b.wk = BiasedLinear(p + "attn.wqkv", 3 * dim, dim, dim + q0, dim + q1);
    b.wv = BiasedLinear(p + "attn.wqkv", 3 * dim, dim, 2 * dim + q0, 2 * dim + q1);
    b.wo = RowParallelBiasedLinear(p + "attn.wo", dim, dim, q0, q1, l_.vision_rank == 0);
    b.mlp.w1 = Linear(p + "mlp.w1", 2 * I, dim, i0, i1);
    b.mlp.w3 = Linear(p + "mlp.w1", 2 * I, dim, I + i0, I + i1);
    b.mlp.w2 = Linear(p + "mlp.w2", dim, I, 0, dim, i0, i1);
    return b;
  }

  // A row-parallel linear with a bias `<prefix>.bias` [out]: input columns [c0, c1), every output row, and
  // the bias only where `with_bias` (one rank of the split), so that the sum over ranks adds it once.
  LinearWeight RowParallelBiasedLinear(const std::string& prefix, int64_t out, int64_t in, int64_t c0, int64_t c1,
                                       bool with_bias) {
    LinearWeight lw = Linear(prefix, out, in, 0, out, c0, c1);
    if (with_bias && !lw.is_exl3()) lw.bias = F32(prefix + ".bias", {out});
    return lw;
  }

  HcWeights Hc(const std::string& p, int rows) {
    const int64_t hcD = c_.hc_mult * c_.hidden_size;
    HcWeights h;
    h.fn = F32(p + "fn", {rows, hcD});
    h.base = F32(p + "base", {rows});
    h.scale = F32(p + "scale", {rows == c_.hc_mult ? 1 : 3});
    return h;
  }

  CompressorWeights Compressor(const std::string& p, int ratio, int c, int64_t d) {
    CompressorWeights w;
    w.wkv = Linear(p + "wkv", c * d, c_.hidden_size);
    w.wgate = Linear(p + "wgate", c * d, c_.hidden_size);
    w.ape = F32(p + "ape", {ratio, c * d});
    w.norm = F32(p + "norm.weight", {d});
    return w;
  }

  AttentionWeights Attention(const std::string& p, AttentionKind kind, int ratio) {
    const ModelConfig& c = c_;
    const int64_t D = c.hidden_size, d = c.head_dim, H = c.num_heads;
    const int64_t hpg = H / c.o_groups;  // heads per output group
    const int g0 = l_.rank * l_.local_groups, g1 = g0 + l_.local_groups;
    AttentionWeights a;
    a.wq_a = Linear(p + "wq_a", c.q_lora_rank, D);
    a.q_norm = F32(p + "q_norm.weight", {c.q_lora_rank});
    a.wq_b = Linear(p + "wq_b", H * d, c.q_lora_rank, g0 * hpg * d, g1 * hpg * d);
    a.wkv = Linear(p + "wkv", d, D);
    a.kv_norm = F32(p + "kv_norm.weight", {d});
    a.wo_a = Linear(p + "wo_a", (int64_t)c.o_groups * c.o_lora_rank, hpg * d, (int64_t)g0 * c.o_lora_rank,
                    (int64_t)g1 * c.o_lora_rank);
    a.wo_b = Linear(p + "wo_b", D, (int64_t)c.o_groups * c.o_lora_rank, 0, D, (int64_t)g0 * c.o_lora_rank,
                    (int64_t)g1 * c.o_lora_rank);
    a.sinks = F32(p + "attn_sink", {H}, g0 * hpg, g1 * hpg);
    if (kind != AttentionKind::kSliding) {
      const int cm = kind == AttentionKind::kCompressedSparse ? 2 : 1;
      a.compressor = Compressor(p + "compressor.", ratio, cm, d);
    }
    if (kind == AttentionKind::kCompressedSparse) {
      const int64_t hi = c.index_n_heads, di = c.index_head_dim;
      a.indexer_wq_b = Linear(p + "indexer.wq_b", hi * di, c.q_lora_rank);
      a.indexer_weights_proj = Linear(p + "indexer.weights_proj", hi, D);
      a.indexer_compressor = Compressor(p + "indexer.compressor.", ratio, 2, di);
    }
    return a;
  }

  ExpertWeights Expert(const std::string& p) {
    const int64_t D = c_.hidden_size, I = c_.moe_intermediate_size;
    const int64_t i0 = l_.rank * l_.local_inter, i1 = i0 + l_.local_inter;
    ExpertWeights e;
    e.w1 = Linear(p + "w1", I, D, i0, i1);
    e.w3 = Linear(p + "w3", I, D, i0, i1);
    e.w2 = Linear(p + "w2", D, I, 0, D, i0, i1);
    return e;
  }

  MoeWeights Moe(int layer, const std::string& p) {
    const ModelConfig& c = c_;
    const int64_t D = c.hidden_size, I = c.moe_intermediate_size, E = c.n_routed_experts;
    MoeWeights m;
    m.gate = Linear(p + "gate", E, D);
    if (c.mlp_kind(layer) == MlpKind::kHashMoe) {
      m.tid2eid = Int32(p + "gate.tid2eid", {c.vocab_size, c.num_experts_per_tok});
      const int32_t* t = m.tid2eid.as<int32_t>();
      for (int64_t i = 0; i < m.tid2eid.numel(); ++i)
        if (t[i] < 0 || t[i] >= E)
          throw std::runtime_error(ckpt_.dir() + ": tensor \"" + p + "gate.tid2eid\" holds expert id " +
                                   std::to_string(t[i]) + " outside [0, " + std::to_string(E) + ")");
    } else {
      m.bias = F32(p + "gate.bias", {E});
    }
    // Image rows route with bias_vl on every main layer, hash layers included (docs/vision.md); an MTP
    // block may carry one too, but drafting does not route image rows.
    if (c.vision.enabled() && (layer < c.num_layers || Has(p + "gate.bias_vl"))) m.bias_vl = F32(p + "gate.bias_vl", {E});
    // Routed experts: per-expert tensors (DeepSeek naming) or transformers' fused 3-D tensors.
    const int64_t i0 = l_.rank * l_.local_inter, i1 = i0 + l_.local_inter;
    std::string gate_up = TransformersGateUpName(layer);
    if (layer < c.num_layers && !Has(p + "experts.0.w1.weight") && ckpt_.Has(gate_up) &&
        !ckpt_.Has(p + "experts.0.w1.trellis")) {
      Tensor gu = ckpt_.Get(gate_up), dn = ckpt_.Get(TransformersDownName(layer));
      CheckShape(gu, {E, 2 * I, D}, gate_up);
      CheckShape(dn, {E, D, I}, TransformersDownName(layer));
      for (int64_t e = 0; e < E; ++e) {
        std::string label = gate_up + "[" + std::to_string(e) + "]";
        ExpertWeights ew;
        Tensor m2 = Matrix(gu, e);
        ew.w1 = DenseLinear(label, m2, i0, i1, 0, D);
        ew.w3 = DenseLinear(label, m2, I + i0, I + i1, 0, D);
        ew.w2 = DenseLinear(TransformersDownName(layer) + "[" + std::to_string(e) + "]", Matrix(dn, e), 0, D, i0, i1);
        m.experts.push_back(std::move(ew));
      }
    } else {
      for (int64_t e = 0; e < E; ++e) m.experts.push_back(Expert(p + "experts." + std::to_string(e) + "."));
    }
    if (c.n_shared_experts > 0) {
      m.shared = Expert(p + "shared_experts.");
      m.has_shared = true;
    }
    return m;
  }

  BlockWeights Block(int layer, const std::string& p) {
    const ModelConfig& c = c_;
    const int hc = c.hc_mult;
    BlockWeights b;
    b.layer = layer;
    b.kind = c.attention_kind(layer);
    b.ratio = c.compress_ratio(layer);
    b.attn_norm = F32(p + "attn_norm.weight", {c.hidden_size});
    b.ffn_norm = F32(p + "ffn_norm.weight", {c.hidden_size});
    b.hc_attn = Hc(p + "hc_attn_", (2 + hc) * hc);
    b.hc_ffn = Hc(p + "hc_ffn_", (2 + hc) * hc);
    b.attn = Attention(p + "attn.", b.kind, b.ratio);
    b.moe = Moe(layer, p + "ffn.");
    return b;
  }

 private:
  const Checkpoint& ckpt_;
  const ModelConfig& c_;
  const ShardLayout& l_;
  Backend& be_;
  const SyntheticSpec* synth_;
  size_t bytes_ = 0;
  int exl3_linears_ = 0, dense_linears_ = 0, head_bits_ = 0;
};

}  // namespace

ShardLayout MakeVisionShardLayout(const ModelConfig& c, const ShardSpec& s) {
  if (s.world < 1 || s.rank < 0 || s.rank >= s.world)
    throw std::runtime_error("invalid shard: rank " + std::to_string(s.rank) + " of world " + std::to_string(s.world));
  ShardLayout l;
  l.rank = s.rank;
  l.world = s.world;
  if (c.vision.n_heads % s.world == 0 && c.vision.inter_dim % s.world == 0) {
    l.vision_world = s.world;
    l.vision_rank = s.rank;
  }
  if (c.hidden_size % s.world == 0) {
    l.aligner_world = s.world;
    l.aligner_rank = s.rank;
  }
  return l;
}

ShardLayout MakeShardLayout(const ModelConfig& c, const ShardSpec& s) {
  ShardLayout l = MakeVisionShardLayout(c, s);
  if (c.o_groups % s.world != 0)
    throw std::runtime_error(c.source + ": o_groups " + std::to_string(c.o_groups) +
                             " is not divisible by the tensor-parallel world " + std::to_string(s.world));
  if (c.moe_intermediate_size % s.world != 0)
    throw std::runtime_error(c.source + ": moe_intermediate_size " + std::to_string(c.moe_intermediate_size) +
                             " is not divisible by the tensor-parallel world " + std::to_string(s.world));
  l.local_groups = c.o_groups / s.world;
  l.local_heads = c.num_heads / s.world;
  l.first_head = s.rank * l.local_heads;
  l.local_inter = c.moe_intermediate_size / s.world;
  return l;
}

namespace {

// Loads every tensor through `ld` (checkpoint or synthetic); `progress` prints a line per layer.
ModelWeights LoadAll(WeightLoader& ld, const Checkpoint& ckpt, const ModelConfig& c, const ShardLayout& l,
                     Backend& be, bool progress) {
  ModelWeights w;
  const auto t0 = std::chrono::steady_clock::now();
  auto report = [&](const std::string& what) {
    if (!progress) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[load] %s (%.1f GiB so far, %.1f s)\n", what.c_str(), ld.bytes() / 1073741824.0, s);
  };
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const Tensor embed = ld.Embedding(V, D, &w.embed_storage);
  w.embed = be.Upload(embed);
  w.head_rows_per_rank = (V + l.world - 1) / l.world;
  w.head_rows_begin = std::min<int64_t>(V, l.rank * w.head_rows_per_rank);
  const int64_t head_end = std::min<int64_t>(V, w.head_rows_begin + w.head_rows_per_rank);
  w.head = ld.Head(w.head_rows_begin, head_end, &embed);
  w.norm = ld.F32("norm.weight", {D});
  w.hc_head = ld.Hc("hc_head_", c.hc_mult);
  report("embedding, head, norms");
  for (int i = 0; i < c.num_layers; ++i) {
    w.layers.push_back(ld.Block(i, "layers." + std::to_string(i) + "."));
    report("layer " + std::to_string(i + 1) + "/" + std::to_string(c.num_layers));
  }
  // MTP blocks: kept for speculative decoding when the checkpoint ships them (transformers drops them).
  for (int m = 0; m < c.num_mtp_layers; ++m) {
    std::string p = "mtp." + std::to_string(m) + ".";
    if (!ld.Has(p + "e_proj.weight") && !ckpt.Has(p + "e_proj.trellis")) {
      if (m == 0) break;  // no MTP at all (transformers drops it): the model serves without speculation
      throw std::runtime_error(ckpt.dir() + ": num_nextn_predict_layers is " + std::to_string(c.num_mtp_layers) +
                               " but tensor \"" + p + "e_proj.weight\" is missing");
    }
    MtpWeights mw;
    mw.e_proj = ld.Linear(p + "e_proj", D, D);
    mw.h_proj = ld.Linear(p + "h_proj", D, D);
    mw.enorm = ld.F32(p + "enorm.weight", {D});
    mw.hnorm = ld.F32(p + "hnorm.weight", {D});
    mw.norm = ld.F32(p + "norm.weight", {D});
    mw.hc_head = ld.Hc(p + "hc_head_", c.hc_mult);
    mw.block = ld.Block(c.num_layers + m, p);
    w.mtp.push_back(std::move(mw));
  }
  if (c.vision.enabled()) {
    w.vision = ld.Vision();
    report("vision tower");
  }
  w.bytes = ld.bytes() + embed.nbytes();
  w.exl3_linears = ld.exl3_linears();
  w.dense_linears = ld.dense_linears();
  w.head_bits = ld.head_bits();
  report("done");
  return w;
}

}  // namespace

namespace {

// "; vision tower 0.5 MiB on this rank (ViT heads 2 of 4, split over 2 ranks; aligner split over 2 ranks)",
// or "" for a text-only model.
std::string DescribeVision(const VisionWeights& v) {
  if (v.blocks.empty()) return "";
  char buf[200];
  const int heads = v.local_heads * v.tower_world;
  std::snprintf(buf, sizeof buf, "; vision tower %.1f MiB on this rank (ViT heads %d of %d, %s; aligner %s)",
                v.bytes / 1048576.0, v.local_heads, heads,
                v.tower_world > 1 ? ("split over " + std::to_string(v.tower_world) + " ranks").c_str() : "replicated",
                v.aligner_world > 1 ? ("split over " + std::to_string(v.aligner_world) + " ranks").c_str() : "replicated");
  return buf;
}

}  // namespace

std::string DescribeWeights(const ModelWeights& w) {
  char buf[160];
  std::snprintf(buf, sizeof buf, ", %d EXL3 + %d dense linears, %.1f MiB on this rank", w.exl3_linears, w.dense_linears,
                w.bytes / 1048576.0);
  char draft[160] = "";
  if (w.draft_rows > 0)
    std::snprintf(draft, sizeof draft, "; draft head: head rows [0, %lld) on every rank, %.1f MiB",
                  static_cast<long long>(w.draft_rows), w.draft_head_bytes / 1048576.0);
  return "embedding " + w.embed_storage + ", head " +
         (w.head_bits > 0 ? "EXL3 K" + std::to_string(w.head_bits) : std::string("dense ") + DTypeName(w.head.dense.dtype)) +
         buf + draft + DescribeVision(w.vision);
}

ModelWeights LoadWeights(const Checkpoint& ckpt, const ModelConfig& c, const ShardLayout& l, Backend& be) {
  WeightLoader ld(ckpt, c, l, be);
  return LoadAll(ld, ckpt, c, l, be, /*progress=*/false);
}

VisionWeights LoadVisionWeights(const Checkpoint& ckpt, const ModelConfig& c, Backend& be) {
  return LoadVisionWeights(ckpt, c, ShardLayout{}, be);  // world 1: the whole tower
}

VisionWeights LoadVisionWeights(const Checkpoint& ckpt, const ModelConfig& c, const ShardLayout& l, Backend& be) {
  if (!c.vision.enabled()) throw std::runtime_error(c.source + ": vision_n_layers is 0 (no vision tower)");
  WeightLoader ld(ckpt, c, l, be);
  return ld.Vision();
}

namespace {

// Head rows [0, rows) through `ld` with the bytes they take: the loader counts dense copies and synthetic
// EXL3 slices; a checkpoint's EXL3 slice is counted here as its 128-row blocks (K bits per weight plus the
// fp16 sign vectors), the part of the tensor the draft head reads.
LinearWeight HeadRows(WeightLoader& ld, const ModelConfig& c, int64_t rows, size_t* bytes) {
  if (rows < 1 || rows > c.vocab_size)
    throw std::runtime_error("draft head: " + std::to_string(rows) + " rows, the vocabulary has " +
                             std::to_string(c.vocab_size));
  const size_t before = ld.bytes();
  LinearWeight lw = ld.Head(0, rows, nullptr);
  *bytes = ld.bytes() - before;
  if (*bytes == 0 && lw.is_exl3()) {
    const int64_t k = (c.hidden_size + 127) / 128 * 128, n = (rows + 127) / 128 * 128;
    *bytes = static_cast<size_t>(k * n * ld.head_bits() / 8 + 2 * (k + n));
  }
  return lw;
}

}  // namespace

LinearWeight LoadHeadRows(const Checkpoint& ckpt, const ModelConfig& c, Backend& be, int64_t rows, size_t* bytes) {
  const ShardLayout whole;  // world 1: the rows are not split
  WeightLoader ld(ckpt, c, whole, be);
  return HeadRows(ld, c, rows, bytes);
}

LinearWeight LoadSyntheticHeadRows(const SyntheticSpec& spec, const ModelConfig& c, Backend& be, int64_t rows,
                                   size_t* bytes) {
  static const Checkpoint kNoFiles;
  const ShardLayout whole;
  WeightLoader ld(kNoFiles, c, whole, be, &spec);
  return HeadRows(ld, c, rows, bytes);
}

ModelWeights LoadSyntheticWeights(const SyntheticSpec& spec, const ModelConfig& c, const ShardLayout& l, Backend& be) {
  static const Checkpoint kNoFiles;
  WeightLoader ld(kNoFiles, c, l, be, &spec);
  return LoadAll(ld, kNoFiles, c, l, be, /*progress=*/true);
}

}  // namespace dsmesh

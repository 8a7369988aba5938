// The CPU backend: every Backend op as plain fp32 loops over host memory, parallel with OpenMP where the
// work is large enough to pay for it. Each op is written to be read next to docs/model-v4.md.
#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/cpu/dense_linear.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec.h"
#include "kernels/cpu/vision_ops.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/exl3/synthetic_exl3.h"
#include "kernels/kv_rows.h"

namespace dsmesh {
namespace {

using cpu::Axpy;
using cpu::Dot;

float* F(const Tensor& t) { return static_cast<float*>(t.data); }

// Row e of paged rows of width dim.
const float* Row(const PagedRows& p, int64_t e, int64_t dim) {
  const int64_t block = p.table[e / p.rows_per_block];
  return F(*p.pool) + (block * p.rows_per_block + e % p.rows_per_block) * dim;
}
int64_t RowWidth(const Tensor& t) { return t.shape.empty() || t.shape[0] == 0 ? 0 : t.numel() / t.shape[0]; }

// Paged rows stored as bf16 or fp8 (--kv-cache-dtype): the first `rows` of them decoded into `storage` as
// one f32 block that `view` describes; f32 rows are returned as they are.
PagedRows AsF32Rows(const PagedRows& p, int64_t rows, int64_t dim, std::vector<float>* storage, Tensor* view) {
  if (!p.pool || p.pool->dtype == DType::kF32 || rows <= 0) return p;
  storage->resize(static_cast<size_t>(rows * dim));
  const int64_t bytes = KvRowBytes(p.pool->dtype, dim, p.rope_dim);
  for (int64_t e = 0; e < rows; ++e) {
    const int64_t row = static_cast<int64_t>(p.table[e / p.rows_per_block]) * p.rows_per_block + e % p.rows_per_block;
    DecodeKvRows(static_cast<const uint8_t*>(p.pool->data) + row * bytes, 1, dim, p.rope_dim, p.pool->dtype,
                 storage->data() + e * dim);
  }
  view->dtype = DType::kF32;
  view->shape = {rows, dim};
  view->data = storage->data();
  view->owner.reset();
  static const int32_t kFirstBlock = 0;
  return PagedRows{view, rows, &kFirstBlock, 1, 0};
}

void Require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::runtime_error(std::string("cpu backend ") + op + ": " + what);
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus (beta 1, threshold 20).
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// An EXL3 weight and the slice of it this rank uses.
struct Exl3Linear {
  Exl3Weight weight;
  Exl3Slice slice;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) {
    if (threads > 0) cpu::SetCpuThreads(threads);
  }

  std::string name() const override { return "cpu"; }

  Tensor Alloc(DType dtype, std::vector<int64_t> shape) override { return AllocateTensor(dtype, std::move(shape)); }
  void Zero(Tensor* t) override {
    if (t->nbytes() > 0) std::memset(t->data, 0, t->nbytes());
  }
  Tensor Upload(const Tensor& host) override { return host; }
  void ToHost(const Tensor& src, void* dst) override { std::memcpy(dst, src.data, src.nbytes()); }
  void FromHost(const void* src, Tensor* dst) override { std::memcpy(dst->data, src, dst->nbytes()); }

  void CopyRows(const Tensor& src, int64_t src_row, Tensor* dst, int64_t dst_row, int64_t rows) override {
    if (rows <= 0) return;
    const size_t row_bytes = static_cast<size_t>(RowWidth(src)) * DTypeSize(src.dtype);
    Require(row_bytes == static_cast<size_t>(RowWidth(*dst)) * DTypeSize(dst->dtype), "CopyRows", "row sizes differ");
    Require(src_row + rows <= src.shape[0] && dst_row + rows <= dst->shape[0], "CopyRows", "rows out of range");
    std::memmove(static_cast<char*>(dst->data) + dst_row * row_bytes,
                 static_cast<const char*>(src.data) + src_row * row_bytes, rows * row_bytes);
  }

  LinearWeight LoadExl3Linear(const Checkpoint& ckpt, const std::string& prefix, int64_t out_features,
                              int64_t in_features, int64_t out_begin, int64_t out_end, int64_t in_begin,
                              int64_t in_end) override {
    auto e = std::make_shared<Exl3Linear>();
    e->weight = LoadExl3Weight(ckpt, prefix, in_features, out_features);
    e->slice = {in_begin, in_end, out_begin, out_end, in_begin == 0};  // input-sliced ranks: only the first adds the bias
    return Exl3LinearWeight(prefix, out_begin, out_end, in_begin, in_end, e);
  }

  LinearWeight SyntheticExl3Linear(const std::string& name, int64_t out_features, int64_t in_features,
                                   int64_t out_begin, int64_t out_end, int64_t in_begin, int64_t in_end, int K,
                                   uint64_t seed) override {
    auto e = std::make_shared<Exl3Linear>();
    e->weight = SyntheticExl3Weight(name, in_features, out_features, K, seed);
    e->slice = {in_begin, in_end, out_begin, out_end, in_begin == 0};
    return Exl3LinearWeight(name, out_begin, out_end, in_begin, in_end, e);
  }

  void Embedding(const Tensor& table, const int32_t* tokens, int64_t n, Tensor* out) override {
    const int64_t D = table.shape[1];
    Require(out->shape[0] == n && RowWidth(*out) == D, "Embedding", "output shape");
    for (int64_t i = 0; i < n; ++i) {
      Require(tokens[i] >= 0 && tokens[i] < table.shape[0], "Embedding", "token id out of range");
      float* o = F(*out) + i * D;
      const char* row = static_cast<const char*>(table.data) + static_cast<size_t>(tokens[i]) * D * DTypeSize(table.dtype);
      switch (table.dtype) {
        case DType::kBF16: for (int64_t k = 0; k < D; ++k) o[k] = cpu::Bf16Scalar(reinterpret_cast<const uint16_t*>(row)[k]); break;
        case DType::kF16: for (int64_t k = 0; k < D; ++k) o[k] = Fp16ToFloat(reinterpret_cast<const uint16_t*>(row)[k]); break;
        case DType::kF32: std::memcpy(o, row, D * sizeof(float)); break;
        default: Require(false, "Embedding", std::string("unsupported table dtype ") + DTypeName(table.dtype));
      }
    }
  }

  void RmsNorm(const Tensor& x, int64_t dim, const Tensor* weight, float eps, Tensor* out) override {
    const int64_t groups = x.numel() / dim;
    Require(groups * dim == x.numel() && out->numel() == x.numel(), "RmsNorm", "shape");
    const float* w = weight ? F(*weight) : nullptr;
    cpu::ParallelFor(groups, groups * dim, [&](int64_t g) {
      const float* xi = F(x) + g * dim;
      float* o = F(*out) + g * dim;
      float r = 1.0f / std::sqrt(Dot(xi, xi, dim) / static_cast<float>(dim) + eps);
      if (w) {
        for (int64_t k = 0; k < dim; ++k) o[k] = w[k] * (xi[k] * r);
      } else {
        for (int64_t k = 0; k < dim; ++k) o[k] = xi[k] * r;
      }
    });
  }

  void Add(const Tensor& a, Tensor* acc) override {
    const int64_t n = a.numel();
    float *y = F(*acc), *x = F(a);
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }

  void Scale(Tensor* x, float s) override {
    const int64_t n = x->numel();
    float* p = F(*x);
    for (int64_t i = 0; i < n; ++i) p[i] *= s;
  }

  void Linear(const Tensor& x, const LinearWeight& w, Tensor* out) override {
    const int64_t m = x.shape[0];
    Require(RowWidth(x) == w.in, "Linear", w.name + ": input width " + std::to_string(RowWidth(x)) + " != " + std::to_string(w.in));
    Require(RowWidth(*out) == w.out && out->shape[0] == m, "Linear", w.name + ": output shape");
    if (w.is_exl3()) {
      const auto& e = *static_cast<const Exl3Linear*>(w.exl3.get());
      Exl3LinearCpu(e.weight, F(x), m, F(*out), e.slice);
      return;  // the EXL3 slice adds its own bias
    }
    cpu::DenseLinear(F(x), w.in, m, w.dense.data, w.dense.dtype, w.in, w.out, w.in, F(*out), w.out);
    if (w.bias.data) {
      for (int64_t r = 0; r < m; ++r) Axpy(1.0f, F(w.bias), F(*out) + r * w.out, w.out);
    }
  }

  void GroupedLinear(const Tensor& x, const LinearWeight& w, int groups, Tensor* out) override {
    const int64_t m = x.shape[0], out_g = w.out / groups;
    Require(RowWidth(x) == groups * w.in && RowWidth(*out) == w.out && w.out % groups == 0, "GroupedLinear",
            w.name + ": shape");
    if (w.is_exl3()) {
      // Group g is output columns [g*out_g, (g+1)*out_g) of the weight on its own input block; EXL3 wants
      // contiguous rows, so gather the group's inputs and scatter its outputs.
      const auto& e = *static_cast<const Exl3Linear*>(w.exl3.get());
      std::vector<float> xg(m * w.in), yg(m * out_g);
      for (int g = 0; g < groups; ++g) {
        for (int64_t r = 0; r < m; ++r)
          std::memcpy(&xg[r * w.in], F(x) + r * groups * w.in + g * w.in, w.in * sizeof(float));
        Exl3Slice slice = e.slice;
        slice.out_begin = e.slice.out_begin + g * out_g;
        slice.out_end = slice.out_begin + out_g;
        Exl3LinearCpu(e.weight, xg.data(), m, yg.data(), slice);
        for (int64_t r = 0; r < m; ++r)
          std::memcpy(F(*out) + r * w.out + g * out_g, &yg[r * out_g], out_g * sizeof(float));
      }
      return;
    }
    const size_t es = DTypeSize(w.dense.dtype);
    for (int g = 0; g < groups; ++g) {
      const void* wg = static_cast<const char*>(w.dense.data) + static_cast<size_t>(g) * out_g * w.in * es;
      cpu::DenseLinear(F(x) + g * w.in, groups * w.in, m, wg, w.dense.dtype, w.in, out_g, w.in, F(*out) + g * out_g,
                       w.out);
    }
  }

  void Rope(Tensor* x, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
            const std::vector<float>& inv_freq, bool inverse) override {
    const int64_t n = x->shape[0], half = rope_dim / 2;
    Require(RowWidth(*x) == heads * head_dim && static_cast<int64_t>(inv_freq.size()) == half && half <= 512,
            "Rope", "shape");
    cpu::ParallelFor(n, n * heads * rope_dim, [&](int64_t r) {
      float cs[512], sn[512];
      for (int64_t i = 0; i < half; ++i) {
        float angle = static_cast<float>(positions[r]) * inv_freq[i];
        cs[i] = std::cos(angle);
        sn[i] = inverse ? -std::sin(angle) : std::sin(angle);
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* p = F(*x) + r * heads * head_dim + h * head_dim + (head_dim - rope_dim);
        for (int64_t i = 0; i < half; ++i) {
          float a = p[2 * i], b = p[2 * i + 1];
          p[2 * i] = a * cs[i] - b * sn[i];
          p[2 * i + 1] = b * cs[i] + a * sn[i];
        }
      }
    });
  }

  // ---- hyper-connections ----
  // mixes[r, k] = rsqrt(mean(X_r^2) + eps) * (fn[k] . X_r)
  void Mixes(const Tensor& X, const Tensor& fn, int64_t k_out, float norm_eps, std::vector<float>* mixes) {
    const int64_t n = X.shape[0], w = RowWidth(X);
    Require(fn.shape.size() == 2 && fn.shape[0] == k_out && fn.shape[1] == w, "HcPre", "fn shape");
    mixes->assign(n * k_out, 0.0f);
    std::vector<float> rs(n);
    for (int64_t r = 0; r < n; ++r) {
      const float* x = F(X) + r * w;
      rs[r] = 1.0f / std::sqrt(Dot(x, x, w) / static_cast<float>(w) + norm_eps);
    }
    float* m = mixes->data();
    cpu::ParallelFor(n * k_out, n * k_out * w, [&](int64_t flat_index) {
      const int64_t r = flat_index / k_out;
      const int64_t k = flat_index % k_out;
      m[r * k_out + k] = rs[r] * Dot(F(fn) + k * w, F(X) + r * w, w);
    });
  }

  void HcPre(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc, int iters,
             float eps, float norm_eps, Tensor* y, Tensor* post, Tensor* comb) override {
    const int64_t n = X.shape[0], D = RowWidth(X) / hc, K = (2 + hc) * hc;
    Require(hc <= 64, "HcPre", "hc_mult above 64");
    std::vector<float> mixes;
    Mixes(X, fn, K, norm_eps, &mixes);
    const float* b = F(base);
    const float* s = F(scale);
    for (int64_t r = 0; r < n; ++r) {
      const float* mx = &mixes[r * K];
      float pre[64];
      for (int i = 0; i < hc; ++i) pre[i] = Sigmoid(mx[i] * s[0] + b[i]) + eps;
      for (int i = 0; i < hc; ++i) F(*post)[r * hc + i] = 2.0f * Sigmoid(mx[hc + i] * s[1] + b[hc + i]);
      float* c = F(*comb) + r * hc * hc;
      for (int i = 0; i < hc; ++i) {  // softmax over the last axis, + eps
        float mxv = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < hc; ++j) {
          c[i * hc + j] = mx[2 * hc + i * hc + j] * s[2] + b[2 * hc + i * hc + j];
          mxv = std::max(mxv, c[i * hc + j]);
        }
        float sum = 0;
        for (int j = 0; j < hc; ++j) sum += (c[i * hc + j] = std::exp(c[i * hc + j] - mxv));
        for (int j = 0; j < hc; ++j) c[i * hc + j] = c[i * hc + j] / sum + eps;
      }
      auto normalize_cols = [&] {
        for (int j = 0; j < hc; ++j) {
          float sum = 0;
          for (int i = 0; i < hc; ++i) sum += c[i * hc + j];
          for (int i = 0; i < hc; ++i) c[i * hc + j] /= sum + eps;
        }
      };
      auto normalize_rows = [&] {
        for (int i = 0; i < hc; ++i) {
          float sum = 0;
          for (int j = 0; j < hc; ++j) sum += c[i * hc + j];
          for (int j = 0; j < hc; ++j) c[i * hc + j] /= sum + eps;
        }
      };
      normalize_cols();
      for (int t = 0; t < iters - 1; ++t) {
        normalize_rows();
        normalize_cols();
      }
      float* yo = F(*y) + r * D;
      const float* x = F(X) + r * hc * D;
      std::fill(yo, yo + D, 0.0f);
      for (int i = 0; i < hc; ++i) Axpy(pre[i], x + i * D, yo, D);
    }
  }

  void HcExpand(const Tensor& h, int hc, Tensor* X) override {
    const int64_t n = h.shape[0], D = RowWidth(h);
    for (int64_t r = 0; r < n; ++r)
      for (int i = 0; i < hc; ++i) std::memcpy(F(*X) + (r * hc + i) * D, F(h) + r * D, D * sizeof(float));
  }

  void HcPost(const Tensor& X, const Tensor& f, const Tensor& post, const Tensor& comb, int hc, Tensor* out) override {
    const int64_t n = X.shape[0], D = RowWidth(f);
    cpu::ParallelFor(n * hc, n * hc * hc * D, [&](int64_t flat_index) {
      const int64_t r = flat_index / hc;
      const int j = static_cast<int>(flat_index % hc);
      float* o = F(*out) + (r * hc + j) * D;
      const float* fr = F(f) + r * D;
      const float pj = F(post)[r * hc + j];
      for (int64_t k = 0; k < D; ++k) o[k] = pj * fr[k];
      for (int i = 0; i < hc; ++i) Axpy(F(comb)[r * hc * hc + i * hc + j], F(X) + (r * hc + i) * D, o, D);
    });
  }

  void HcHead(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale, int hc, float eps,
              float norm_eps, Tensor* y) override {
    const int64_t n = X.shape[0], D = RowWidth(X) / hc;
    std::vector<float> mixes;
    Mixes(X, fn, hc, norm_eps, &mixes);
    for (int64_t r = 0; r < n; ++r) {
      float* yo = F(*y) + r * D;
      std::fill(yo, yo + D, 0.0f);
      for (int i = 0; i < hc; ++i) {
        float pre = Sigmoid(mixes[r * hc + i] * F(scale)[0] + F(base)[i]) + eps;
        Axpy(pre, F(X) + (r * hc + i) * D, yo, D);
      }
    }
  }

  // ---- compressor ----
  void AddPositionBias(Tensor* score, const Tensor& ape, const int64_t* positions, int ratio) override {
    const int64_t n = score->shape[0], w = RowWidth(*score);
    Require(RowWidth(ape) == w && ape.shape[0] == ratio, "AddPositionBias", "ape shape");
    for (int64_t r = 0; r < n; ++r) Axpy(1.0f, F(ape) + (positions[r] % ratio) * w, F(*score) + r * w, w);
  }

  void CompressorPool(const Tensor& kv, const Tensor& score, int64_t base_pos, int64_t first_window,
                      int64_t num_windows, int ratio, bool overlap, int64_t d, Tensor* out) override {
    const int64_t width = RowWidth(kv), rows = kv.shape[0];
    Require(width == (overlap ? 2 : 1) * d && RowWidth(*out) == d, "CompressorPool", "shape");
    Require(ratio <= 1024, "CompressorPool", "compress ratio above 1024");
    // Checked before the parallel loop: an exception must not cross an OpenMP region.
    const int64_t first_row = (overlap && first_window >= 1 ? first_window - 1 : first_window) * ratio - base_pos;
    const int64_t last_row = (first_window + num_windows) * ratio - 1 - base_pos;
    Require(num_windows <= 0 || (first_row >= 0 && last_row < rows), "CompressorPool", "window rows not provided");
    cpu::ParallelFor(num_windows, num_windows * d * ratio, [&](int64_t wi) {
      const int64_t w = first_window + wi;
      // Slots: (row, channel offset). With overlap, window w-1's first halves come first.
      int64_t slot_row[2048];
      int64_t slot_off[2048];
      int slots = 0;
      if (overlap && w >= 1)
        for (int t = 0; t < ratio; ++t) slot_row[slots] = (w - 1) * ratio + t - base_pos, slot_off[slots++] = 0;
      for (int t = 0; t < ratio; ++t) slot_row[slots] = w * ratio + t - base_pos, slot_off[slots++] = overlap ? d : 0;
      float* o = F(*out) + wi * d;
      for (int64_t ch = 0; ch < d; ++ch) {
        float mx = -std::numeric_limits<float>::infinity();
        for (int i = 0; i < slots; ++i) mx = std::max(mx, F(score)[slot_row[i] * width + slot_off[i] + ch]);
        float sum = 0, acc = 0;
        for (int i = 0; i < slots; ++i) {
          float e = std::exp(F(score)[slot_row[i] * width + slot_off[i] + ch] - mx);
          sum += e;
          acc += e * F(kv)[slot_row[i] * width + slot_off[i] + ch];
        }
        o[ch] = acc / sum;
      }
    });
  }

  // ---- indexer ----
  void IndexerTopK(const Tensor& q, const Tensor& weights, const PagedRows& keys_in, int64_t num_keys, int64_t heads,
                   int64_t dim, const int64_t* positions, int ratio, int top_k, Tensor* out) override {
    const int64_t n = q.shape[0];
    Require(num_keys <= keys_in.capacity(), "IndexerTopK", "more keys than the block table holds");
    std::vector<float> decoded;
    Tensor decoded_view;
    const PagedRows keys = AsF32Rows(keys_in, num_keys, dim, &decoded, &decoded_view);
    int32_t* o = static_cast<int32_t*>(out->data);
    cpu::ParallelFor(n, n * num_keys * heads * dim, [&](int64_t r) {
      const int64_t valid = std::min<int64_t>(num_keys, (positions[r] + 1) / ratio);
      std::vector<float> score(valid, 0.0f);
      const float* qr = F(q) + r * heads * dim;
      const float* wr = F(weights) + r * heads;
      for (int64_t w = 0; w < valid; ++w) {
        const float* k = Row(keys, w, dim);
        float s = 0;
        for (int64_t h = 0; h < heads; ++h) s += wr[h] * std::max(0.0f, Dot(qr + h * dim, k, dim));
        score[w] = s;
      }
      std::vector<int32_t> idx(valid);
      std::iota(idx.begin(), idx.end(), 0);
      const int64_t k = std::min<int64_t>(top_k, valid);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return score[a] > score[b] || (score[a] == score[b] && a < b);
      });
      for (int64_t i = 0; i < top_k; ++i) o[r * top_k + i] = i < k ? idx[i] : -1;
    });
  }

  // ---- attention ----
  void Attention(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring, const Tensor& new_kv,
                 int window, const PagedRows* entries_in, int64_t num_entries, int ratio, const Tensor* topk,
                 const Tensor& sinks, float softmax_scale, Tensor* out) override {
    WindowAttention(q, heads, d, start, ring, new_kv, window, nullptr, nullptr, entries_in, num_entries, ratio, topk,
                    sinks, softmax_scale, out);
  }

  void SpanWindowAttention(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring,
                           const Tensor& new_kv, int window, const int64_t* visible_from, const int64_t* visible_to,
                           const PagedRows* entries, int64_t num_entries, int ratio, const Tensor* topk,
                           const Tensor& sinks, float softmax_scale, Tensor* out) override {
    const int64_t n = q.shape[0];
    CheckSpanWindowBounds("cpu backend SpanWindowAttention", n, start, window, visible_from, visible_to);
    WindowAttention(q, heads, d, start, ring, new_kv, window, visible_from, visible_to, entries, num_entries, ratio,
                    topk, sinks, softmax_scale, out);
  }

  bool supports_image_rows() const override { return true; }

  // Attention and SpanWindowAttention: window keys max(0, t-window+1) .. t, or from[r] .. to[r] when given.
  void WindowAttention(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring,
                       const Tensor& new_kv, int window, const int64_t* from, const int64_t* to,
                       const PagedRows* entries_in, int64_t num_entries, int ratio, const Tensor* topk,
                       const Tensor& sinks, float softmax_scale, Tensor* out) {
    const int64_t n = q.shape[0];
    Require(!entries_in || num_entries <= entries_in->capacity(), "Attention", "more entries than the block table holds");
    std::vector<float> decoded;
    Tensor decoded_view;
    PagedRows entries_f32;
    if (entries_in) entries_f32 = AsF32Rows(*entries_in, num_entries, d, &decoded, &decoded_view);
    const PagedRows* entries = entries_in ? &entries_f32 : nullptr;
    const int64_t k_cols = topk ? RowWidth(*topk) : 0;
    // Parallel only when the keys x dims work pays for waking the team (the machine may be shared).
    const int64_t work = n * heads * (window + std::min<int64_t>(num_entries, topk ? k_cols : num_entries)) * d;
    cpu::ParallelFor(n * heads, work, [&](int64_t flat_index) {
      const int64_t r = flat_index / heads;
      const int64_t h = flat_index % heads;
      const int64_t t = start + r;
      const int64_t slots = ring.shape[0];
      thread_local std::vector<const float*> keys;
      thread_local std::vector<float> s;
      keys.clear();
      const int64_t lo = from ? from[r] : std::max<int64_t>(0, t - window + 1), hi = to ? to[r] : t;
      for (int64_t p = lo; p <= hi; ++p)
        keys.push_back(p < start ? F(ring) + (p % slots) * d : F(new_kv) + (p - start) * d);
      if (entries && ratio > 0) {
        const int64_t visible = std::min<int64_t>(num_entries, (t + 1) / ratio);
        if (topk) {
          const int32_t* sel = static_cast<const int32_t*>(topk->data) + r * k_cols;
          for (int64_t i = 0; i < k_cols; ++i)
            if (sel[i] >= 0 && sel[i] < visible) keys.push_back(Row(*entries, sel[i], d));
        } else {
          for (int64_t w = 0; w < visible; ++w) keys.push_back(Row(*entries, w, d));
        }
      }
      const float* qh = F(q) + (r * heads + h) * d;
      const float sink = F(sinks)[h];
      s.resize(keys.size());
      float mx = sink;
      for (size_t j = 0; j < keys.size(); ++j) mx = std::max(mx, s[j] = Dot(qh, keys[j], d) * softmax_scale);
      float denom = std::exp(sink - mx);
      for (size_t j = 0; j < keys.size(); ++j) denom += (s[j] = std::exp(s[j] - mx));
      float* o = F(*out) + (r * heads + h) * d;
      std::fill(o, o + d, 0.0f);
      for (size_t j = 0; j < keys.size(); ++j) Axpy(s[j] / denom, keys[j], o, d);
    });
  }

  void StoreKvRows(const Tensor& src, int64_t src_row, int64_t rows, int64_t rope_dim, Tensor* dst,
                   int64_t dst_row) override {
    const int64_t dim = RowWidth(src), bytes = KvRowBytes(dst->dtype, dim, rope_dim);
    Require(RowWidth(*dst) * static_cast<int64_t>(DTypeSize(dst->dtype)) == bytes, "StoreKvRows",
            "destination rows are not the storage's row size");
    Require(src_row + rows <= src.shape[0] && dst_row + rows <= dst->shape[0], "StoreKvRows", "rows out of range");
    EncodeKvRows(F(src) + src_row * dim, rows, dim, rope_dim, dst->dtype,
                 static_cast<uint8_t*>(dst->data) + dst_row * bytes);
  }

  void UpdateRing(const Tensor& new_kv, int64_t start, int window, Tensor* ring) override {
    const int64_t n = new_kv.shape[0], d = RowWidth(new_kv), slots = ring->shape[0];
    Require(slots >= window, "UpdateRing", "ring has fewer slots than the window");
    for (int64_t i = std::max<int64_t>(0, n - slots); i < n; ++i)
      std::memcpy(F(*ring) + ((start + i) % slots) * d, F(new_kv) + i * d, d * sizeof(float));
  }

  // ---- MoE ----
  void MoeRoute(const Tensor& logits, const int32_t* tokens, const RouterParams& p, Tensor* idx,
                Tensor* weight) override {
    const int64_t n = logits.shape[0], E = RowWidth(logits);
    const int k = p.top_k;
    Require(!p.image_rows || (p.bias_vl && p.bias_vl->numel() == E), "MoeRoute", "image rows without bias_vl [E]");
    int32_t* ix = static_cast<int32_t*>(idx->data);
    for (int64_t r = 0; r < n; ++r) {
      std::vector<float> score(E);
      for (int64_t e = 0; e < E; ++e) score[e] = std::sqrt(Softplus(F(logits)[r * E + e]));
      const bool image = p.image_rows && p.image_rows[r];
      if (p.hash && !image) {
        const int32_t* row = static_cast<const int32_t*>(p.tid2eid->data) + static_cast<int64_t>(tokens[r]) * k;
        for (int i = 0; i < k; ++i) ix[r * k + i] = row[i];
      } else {
        std::vector<float> biased(E);
        const Tensor* bias = image ? p.bias_vl : p.bias;
        for (int64_t e = 0; e < E; ++e) biased[e] = score[e] + (bias ? F(*bias)[e] : 0.0f);
        std::vector<int32_t> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
          return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
        });
        for (int i = 0; i < k; ++i) ix[r * k + i] = order[i];
      }
      float sum = 0;
      for (int i = 0; i < k; ++i) sum += score[ix[r * k + i]];
      for (int i = 0; i < k; ++i) {
        float w = score[ix[r * k + i]];
        if (p.normalize) w /= sum + 1e-20f;
        F(*weight)[r * k + i] = w * p.routed_scale;
      }
    }
  }

  // out[rows] += weights * expert(x[rows]) for one expert over a gathered set of rows.
  void RunExpert(const Tensor& x, const std::vector<int64_t>& rows, const std::vector<float>& wts,
                 const ExpertWeights& e, float limit, Tensor* out) {
    const int64_t m = rows.size(), D = RowWidth(x), I = e.w1.out;
    Tensor xs = Alloc(DType::kF32, {m, D});
    for (int64_t i = 0; i < m; ++i) std::memcpy(F(xs) + i * D, F(x) + rows[i] * D, D * sizeof(float));
    Tensor g = Alloc(DType::kF32, {m, I}), u = Alloc(DType::kF32, {m, I}), y = Alloc(DType::kF32, {m, D});
    Linear(xs, e.w1, &g);
    Linear(xs, e.w3, &u);
    float *gp = F(g), *up = F(u);
    for (int64_t i = 0; i < m * I; ++i) {
      float gv = gp[i], uv = up[i];
      if (limit > 0) {
        gv = std::min(gv, limit);
        uv = std::clamp(uv, -limit, limit);
      }
      gp[i] = gv / (1.0f + std::exp(-gv)) * uv;
    }
    Linear(g, e.w2, &y);
    for (int64_t i = 0; i < m; ++i) Axpy(wts[i], F(y) + i * D, F(*out) + rows[i] * D, D);
  }

  void MoeExperts(const Tensor& x, const Tensor& idx, const Tensor& weight, const std::vector<ExpertWeights>& experts,
                  float limit, Tensor* out) override {
    const int64_t n = x.shape[0], k = RowWidth(idx);
    std::vector<std::vector<int64_t>> rows(experts.size());
    std::vector<std::vector<float>> wts(experts.size());
    const int32_t* ix = static_cast<const int32_t*>(idx.data);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i) {
        int32_t e = ix[r * k + i];
        Require(e >= 0 && e < static_cast<int32_t>(experts.size()), "MoeExperts", "expert id out of range");
        rows[e].push_back(r);
        wts[e].push_back(F(weight)[r * k + i]);
      }
    for (size_t e = 0; e < experts.size(); ++e)
      if (!rows[e].empty()) RunExpert(x, rows[e], wts[e], experts[e], limit, out);
  }

  void SharedExpert(const Tensor& x, const ExpertWeights& expert, float limit, Tensor* out) override {
    std::vector<int64_t> rows(x.shape[0]);
    std::iota(rows.begin(), rows.end(), 0);
    RunExpert(x, rows, std::vector<float>(rows.size(), 1.0f), expert, limit, out);
  }

  // ---- vision encoder (kernels/cpu/vision_ops.cc) ----
  void RotateHalf(Tensor* x, int64_t heads, int64_t head_dim, const Tensor& angles) override {
    const int64_t n = x->shape[0];
    Require(head_dim % 2 == 0 && RowWidth(*x) == heads * head_dim, "RotateHalf", "x shape");
    Require(angles.numel() == n * head_dim / 2, "RotateHalf", "angles shape");
    cpu::RotateHalf(F(*x), n, heads, head_dim, F(angles));
  }

  void SpanAttention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads, int64_t d,
                     const int64_t* spans, int64_t num_spans, float softmax_scale, Tensor* out) override {
    const int64_t n = q.shape[0], width = heads * d;
    Require(RowWidth(q) == width && RowWidth(k) == width && RowWidth(v) == width && RowWidth(*out) == width,
            "SpanAttention", "row widths");
    Require(k.shape[0] == n && v.shape[0] == n && out->shape[0] == n, "SpanAttention", "row counts");
    Require(num_spans >= 0 && spans[0] == 0 && spans[num_spans] == n, "SpanAttention", "spans must cover rows 0..n");
    for (int64_t s = 0; s < num_spans; ++s) Require(spans[s] <= spans[s + 1], "SpanAttention", "spans not ascending");
    cpu::SpanAttention(F(q), F(k), F(v), heads, d, spans, num_spans, softmax_scale, F(*out));
  }

  void Gelu(Tensor* x) override { cpu::Gelu(F(*x), x->numel()); }

  void Unfold2D(const Tensor& x, int64_t h, int64_t w, int r, Tensor* out) override {
    Require(r >= 1 && x.shape[0] == h * w, "Unfold2D", "x rows != h * w");
    const int64_t C = RowWidth(x), blocks = ((h + r - 1) / r) * ((w + r - 1) / r);
    Require(out->shape[0] == blocks && RowWidth(*out) == C * r * r, "Unfold2D", "output shape");
    cpu::Unfold2D(F(x), h, w, C, r, F(*out));
  }

  // The reference sampler itself, row by row (the CUDA kernels are tested against this).
  std::vector<SampledRow> SampleRows(const Tensor& logits, const std::vector<RowSampling>& rows) override {
    const int64_t n = static_cast<int64_t>(rows.size()), vocab = RowWidth(logits);
    Require(logits.dtype == DType::kF32 && logits.shape[0] == n, "SampleRows", "logits must be f32 [rows, vocab]");
    std::vector<SampledRow> out(n);
    cpu::ParallelFor(n, n * vocab * 16, [&](int64_t r) { out[r] = SampleRow(F(logits) + r * vocab, vocab, rows[r]); });
    return out;
  }
};

}  // namespace

std::shared_ptr<Backend> MakeCpuBackend(int threads) { return std::make_shared<CpuBackend>(threads); }

}  // namespace dsmesh

#include "kernels/exl3/exl3_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "common/half.h"
#include "kernels/exl3/hadamard.h"
#include "kernels/exl3/parallel.h"
#include "kernels/exl3/tile_decode_avx2.h"
#include "kernels/exl3/trellis.h"

namespace dsmesh {

using exl3_internal::DecodeTileGroupOrder;
using exl3_internal::DispatchK;

// ---------------------------------------------------------------------------------------------------
// Loading and validation

TensorLookup LookupIn(const Checkpoint& ckpt) {
  const Checkpoint* c = &ckpt;
  return [c](const std::string& name) -> std::optional<Tensor> {
    if (!c->Has(name)) return std::nullopt;
    return c->Get(name);
  };
}

TensorLookup LookupIn(const SafetensorsFile& file) {
  const SafetensorsFile* f = &file;
  return [f](const std::string& name) -> std::optional<Tensor> {
    if (!f->Has(name)) return std::nullopt;
    return f->Get(name);
  };
}

bool HasExl3Weight(const Checkpoint& ckpt, const std::string& prefix) { return ckpt.Has(prefix + ".trellis"); }

namespace {

[[noreturn]] void Fail(const std::string& tensor, const std::string& problem) {
  throw std::runtime_error("EXL3 tensor " + tensor + ": " + problem);
}

void CheckMarker(const Tensor& t, const std::string& name, uint32_t expected) {
  if (t.dtype != DType::kI32) Fail(name, std::string("dtype ") + DTypeName(t.dtype) + ", expected I32");
  if (t.numel() != 1 || t.shape.size() > 1) Fail(name, "shape " + t.ShapeString() + ", expected a scalar");
  uint32_t v;
  std::memcpy(&v, t.data, 4);
  if (v != expected) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "multiplier 0x%08X, expected 0x%08X", v, expected);
    Fail(name, buf);
  }
}

void CheckScale(const std::optional<Tensor>& t, const std::string& name, int64_t length) {
  if (t->dtype != DType::kF16) Fail(name, std::string("dtype ") + DTypeName(t->dtype) + ", expected F16");
  if (t->shape.size() != 1 || t->shape[0] != length)
    Fail(name, "shape " + t->ShapeString() + ", expected [" + std::to_string(length) + "] (from the trellis shape)");
}

}  // namespace

Exl3Weight LoadExl3Weight(const TensorLookup& lookup, const std::string& prefix, int64_t in_features,
                          int64_t out_features) {
  Exl3Weight w;
  w.name = prefix;
  const std::string tn = prefix + ".trellis";
  std::optional<Tensor> trellis = lookup(tn);
  if (!trellis) Fail(tn, "missing");
  if (trellis->dtype != DType::kI16) Fail(tn, std::string("dtype ") + DTypeName(trellis->dtype) + ", expected I16");
  if (trellis->shape.size() != 3) Fail(tn, "rank " + std::to_string(trellis->shape.size()) + " (shape " + trellis->ShapeString() + "), expected [k/16, n/16, 16K]");
  const int64_t width = trellis->shape[2];
  if (width % 16 != 0)
    Fail(tn, "last dimension " + std::to_string(width) + " is not a multiple of 16 (fractional bitrates of non-upstream forks are not supported)");
  if (width / 16 < kExl3MinK || width / 16 > kExl3MaxK) Fail(tn, "K=" + std::to_string(width / 16) + " out of range 1..8");
  w.K = static_cast<int>(width / 16);
  const int64_t k = trellis->shape[0] * 16, n = trellis->shape[1] * 16;
  if (k <= 0 || n <= 0 || k % 128 != 0 || n % 128 != 0)
    Fail(tn, "shape " + trellis->ShapeString() + " gives k=" + std::to_string(k) + ", n=" + std::to_string(n) + "; both must be positive multiples of 128");
  w.trellis = *trellis;

  const std::string sun = prefix + ".suh", svn = prefix + ".svh";
  std::optional<Tensor> suh = lookup(sun), svh = lookup(svn);
  if (!suh && lookup(prefix + ".su")) Fail(prefix + ".su", "legacy packed sign tensors (su/sv) are not supported; expected suh/svh");
  if (!suh) Fail(sun, "missing");
  if (!svh) Fail(svn, "missing");
  CheckScale(suh, sun, k);
  CheckScale(svh, svn, n);
  w.suh = *suh;
  w.svh = *svh;

  std::optional<Tensor> mcg = lookup(prefix + ".mcg"), mul1 = lookup(prefix + ".mul1");
  if (mcg && mul1) Fail(prefix + ".mcg", "both .mcg and .mul1 markers are present");
  w.codebook = Exl3Codebook::k3Inst;
  if (mcg) {
    CheckMarker(*mcg, prefix + ".mcg", kExl3McgMultiplier);
    w.codebook = Exl3Codebook::kMcg;
  }
  if (mul1) {
    CheckMarker(*mul1, prefix + ".mul1", kExl3Mul1Multiplier);
    w.codebook = Exl3Codebook::kMul1;
  }

  w.in_features = in_features < 0 ? k : in_features;
  w.out_features = out_features < 0 ? n : out_features;
  if (w.in_features > k || (w.in_features + 127) / 128 * 128 != k)
    Fail(tn, "in_features " + std::to_string(w.in_features) + " does not pad to k=" + std::to_string(k));
  if (w.out_features > n || (w.out_features + 127) / 128 * 128 != n)
    Fail(tn, "out_features " + std::to_string(w.out_features) + " does not pad to n=" + std::to_string(n));

  const std::string bn = prefix + ".bias";
  if (std::optional<Tensor> bias = lookup(bn)) {
    if (bias->dtype != DType::kF16 && bias->dtype != DType::kBF16 && bias->dtype != DType::kF32)
      Fail(bn, std::string("dtype ") + DTypeName(bias->dtype) + ", expected F16, BF16 or F32");
    if (bias->shape.size() != 1 || (bias->shape[0] != n && bias->shape[0] != w.out_features))
      Fail(bn, "shape " + bias->ShapeString() + ", expected [" + std::to_string(n) + "]");
    w.bias = *bias;
  }
  return w;
}

Exl3Weight LoadExl3Weight(const Checkpoint& ckpt, const std::string& prefix, int64_t in_features,
                          int64_t out_features) {
  try {
    return LoadExl3Weight(LookupIn(ckpt), prefix, in_features, out_features);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) + " (checkpoint " + ckpt.dir() + ")");
  }
}

// ---------------------------------------------------------------------------------------------------
// Decode GEMM: yh[m, n] = xh[m, k] Ŵ, tiles decoded on the fly.

namespace {

constexpr int kSmallM = 16;  // up to this many rows, decode one tile at a time and stream

// A 32-byte aligned float buffer (for AVX loads and stores).
struct AlignedFloats {
  explicit AlignedFloats(size_t n) : p(static_cast<float*>(std::aligned_alloc(32, (n * sizeof(float) + 31) / 32 * 32))) {
    if (!p) throw std::bad_alloc();
  }
  ~AlignedFloats() { std::free(p); }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* get() const { return p; }
  float* p;
};

std::vector<float> HalfVectorToFloat(const Tensor& t) {
  std::vector<float> out(t.numel());
  const uint16_t* h = t.as<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = _cvtsh_ss(h[i]);
  return out;
}

// For each row and strip i, the four multiplier vectors of group-order lanes:
// xp[((row * strips + i) * 4 + p)] = [x[r0], x[r0], x[r0+1], x[r0+1], x[r0+8], x[r0+8], x[r0+9], x[r0+9]]
// with r0 = 2p, read from xh[row, 16 i ..].
std::vector<float> MakeLaneMultipliers(const float* xh, int64_t m, int64_t k) {
  const int64_t strips = k / 16;
  std::vector<float> xp(static_cast<size_t>(m * strips * 4 * 8));
  for (int64_t row = 0; row < m; ++row)
    for (int64_t i = 0; i < strips; ++i)
      for (int p = 0; p < 4; ++p) {
        float* dst = &xp[((row * strips + i) * 4 + p) * 8];
        const float* src = xh + row * k + 16 * i + 2 * p;
        for (int l = 0; l < 8; ++l) dst[l] = src[exl3_internal::kLaneRow[l]];
      }
  return xp;
}

// Lane sums of a group-order accumulator set: acc[c0] even lanes -> column c0, odd -> column c0 + 8.
inline void ReduceColumns(const __m256* acc, float* out16) {
  for (int c0 = 0; c0 < 8; ++c0) {
    alignas(32) float a[8];
    _mm256_store_ps(a, acc[c0]);
    out16[c0] = (a[0] + a[2]) + (a[4] + a[6]);
    out16[c0 + 8] = (a[1] + a[3]) + (a[5] + a[7]);
  }
}

struct GemmArgs {
  const uint16_t* trellis;  // tile (0, 0) of the computed block
  int64_t tile_stride;      // tiles per trellis row (the full n / 16)
  int64_t k, n;             // size of the computed block (strips * 16, columns * 16)
  const float* xp;  // lane multipliers (small m)
  const float* xh;  // transformed input (large m)
  int64_t m;
  float* yh;  // [m, n]
};

// m == 1: accumulators stay in registers, decode fused with the FMAs.
template <int K, Exl3Codebook CB>
struct GemvKernel {
  static void Run(const GemmArgs& a, int64_t j0, int64_t j1) {
    const int64_t strips = a.k / 16, tiles_n = a.tile_stride, words = 16 * K;
    for (int64_t j = j0; j < j1; ++j) {
      __m256 acc[8];
      for (auto& v : acc) v = _mm256_setzero_ps();
      for (int64_t i = 0; i < strips; ++i) {
        const uint16_t* tile = a.trellis + (i * tiles_n + j) * words;
        if (i + 2 < strips) _mm_prefetch(reinterpret_cast<const char*>(tile + 2 * tiles_n * words), _MM_HINT_T0);
        exl3_internal::TileStream ts;
        exl3_internal::LoadTileStream(tile, K, &ts);
        const float* xp = a.xp + i * 32;
        const __m256 x0 = _mm256_loadu_ps(xp), x1 = _mm256_loadu_ps(xp + 8), x2 = _mm256_loadu_ps(xp + 16),
                     x3 = _mm256_loadu_ps(xp + 24);
        for (int c0 = 0; c0 < 8; ++c0) {
          const int g = 4 * c0;
          __m256 s = acc[c0];
          s = _mm256_fmadd_ps(exl3_internal::CodebookF32x8<CB>(exl3_internal::StatesOfGroup<K>(ts, g + 0)), x0, s);
          s = _mm256_fmadd_ps(exl3_internal::CodebookF32x8<CB>(exl3_internal::StatesOfGroup<K>(ts, g + 1)), x1, s);
          s = _mm256_fmadd_ps(exl3_internal::CodebookF32x8<CB>(exl3_internal::StatesOfGroup<K>(ts, g + 2)), x2, s);
          s = _mm256_fmadd_ps(exl3_internal::CodebookF32x8<CB>(exl3_internal::StatesOfGroup<K>(ts, g + 3)), x3, s);
          acc[c0] = s;
        }
      }
      ReduceColumns(acc, a.yh + 16 * j);
    }
  }
};

// 2 <= m <= 16: decode each tile once into L1, then every row accumulates from it.
template <int K, Exl3Codebook CB>
struct SmallMKernel {
  static void Run(const GemmArgs& a, int64_t j0, int64_t j1) {
    const int64_t strips = a.k / 16, tiles_n = a.tile_stride, words = 16 * K, m = a.m;
    alignas(32) float tile_f[256];
    AlignedFloats acc_buf(static_cast<size_t>(m * 64));
    __m256* acc = reinterpret_cast<__m256*>(acc_buf.get());
    for (int64_t j = j0; j < j1; ++j) {
      for (int64_t i = 0; i < m * 8; ++i) acc[i] = _mm256_setzero_ps();
      for (int64_t i = 0; i < strips; ++i) {
        const uint16_t* tile = a.trellis + (i * tiles_n + j) * words;
        if (i + 2 < strips) _mm_prefetch(reinterpret_cast<const char*>(tile + 2 * tiles_n * words), _MM_HINT_T0);
        DecodeTileGroupOrder<K, CB>(tile, tile_f);
        // Rows in pairs: each decoded vector feeds two rows' FMAs (8 multipliers + 4 tile values live).
        int64_t row = 0;
        for (; row + 1 < m; row += 2) {
          const float* xa = a.xp + (row * strips + i) * 32;
          const float* xb = a.xp + ((row + 1) * strips + i) * 32;
          const __m256 a0 = _mm256_loadu_ps(xa), a1 = _mm256_loadu_ps(xa + 8), a2 = _mm256_loadu_ps(xa + 16),
                       a3 = _mm256_loadu_ps(xa + 24);
          const __m256 b0 = _mm256_loadu_ps(xb), b1 = _mm256_loadu_ps(xb + 8), b2 = _mm256_loadu_ps(xb + 16),
                       b3 = _mm256_loadu_ps(xb + 24);
          __m256* ra = &acc[row * 8];
          __m256* rb = &acc[(row + 1) * 8];
          for (int c0 = 0; c0 < 8; ++c0) {
            const float* v = tile_f + 32 * c0;
            const __m256 v0 = _mm256_load_ps(v), v1 = _mm256_load_ps(v + 8), v2 = _mm256_load_ps(v + 16),
                         v3 = _mm256_load_ps(v + 24);
            __m256 sa = ra[c0], sb = rb[c0];
            sa = _mm256_fmadd_ps(v0, a0, sa);
            sb = _mm256_fmadd_ps(v0, b0, sb);
            sa = _mm256_fmadd_ps(v1, a1, sa);
            sb = _mm256_fmadd_ps(v1, b1, sb);
            sa = _mm256_fmadd_ps(v2, a2, sa);
            sb = _mm256_fmadd_ps(v2, b2, sb);
            sa = _mm256_fmadd_ps(v3, a3, sa);
            sb = _mm256_fmadd_ps(v3, b3, sb);
            ra[c0] = sa;
            rb[c0] = sb;
          }
        }
        for (; row < m; ++row) {
          const float* xp = a.xp + (row * strips + i) * 32;
          const __m256 x0 = _mm256_loadu_ps(xp), x1 = _mm256_loadu_ps(xp + 8), x2 = _mm256_loadu_ps(xp + 16),
                       x3 = _mm256_loadu_ps(xp + 24);
          __m256* ra = &acc[row * 8];
          for (int c0 = 0; c0 < 8; ++c0) {
            const float* v = tile_f + 32 * c0;
            __m256 s = ra[c0];
            s = _mm256_fmadd_ps(_mm256_load_ps(v), x0, s);
            s = _mm256_fmadd_ps(_mm256_load_ps(v + 8), x1, s);
            s = _mm256_fmadd_ps(_mm256_load_ps(v + 16), x2, s);
            s = _mm256_fmadd_ps(_mm256_load_ps(v + 24), x3, s);
            ra[c0] = s;
          }
        }
      }
      for (int64_t row = 0; row < m; ++row) ReduceColumns(&acc[row * 8], a.yh + row * a.n + 16 * j);
    }
  }
};

// Row-major cell index of every group-order slot.
struct GroupOrderCells {
  int cell[256];
  GroupOrderCells() {
    for (int q = 0; q < 32; ++q)
      for (int l = 0; l < 8; ++l)
        cell[8 * q + l] = 16 * (2 * (q % 4) + exl3_internal::kLaneRow[l]) + (q / 4 + exl3_internal::kLaneCol[l]);
  }
};
const GroupOrderCells kCells;

// m > 16: decode one 16-column strip (all k rows) into a k x 16 buffer, then a register-blocked GEMM.
template <int K, Exl3Codebook CB>
struct LargeMKernel {
  static void Run(const GemmArgs& a, int64_t j0, int64_t j1) {
    const int64_t strips = a.k / 16, tiles_n = a.tile_stride, words = 16 * K, m = a.m, k = a.k;
    AlignedFloats wcol(static_cast<size_t>(k * 16));
    alignas(32) float tile_f[256];
    for (int64_t j = j0; j < j1; ++j) {
      for (int64_t i = 0; i < strips; ++i) {
        DecodeTileGroupOrder<K, CB>(a.trellis + (i * tiles_n + j) * words, tile_f);
        float* dst = wcol.get() + i * 256;
        for (int s = 0; s < 256; ++s) dst[kCells.cell[s]] = tile_f[s];
      }
      constexpr int kRows = 6;
      for (int64_t r0 = 0; r0 < m; r0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
        __m256 lo[kRows], hi[kRows];
        for (int r = 0; r < kRows; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
        const float* xr = a.xh + r0 * k;
        if (rows == kRows) {
          for (int64_t kk = 0; kk < k; ++kk) {
            const __m256 w0 = _mm256_load_ps(wcol.get() + kk * 16), w1 = _mm256_load_ps(wcol.get() + kk * 16 + 8);
            for (int r = 0; r < kRows; ++r) {
              const __m256 xb = _mm256_broadcast_ss(xr + r * k + kk);
              lo[r] = _mm256_fmadd_ps(xb, w0, lo[r]);
              hi[r] = _mm256_fmadd_ps(xb, w1, hi[r]);
            }
          }
        } else {
          for (int64_t kk = 0; kk < k; ++kk) {
            const __m256 w0 = _mm256_load_ps(wcol.get() + kk * 16), w1 = _mm256_load_ps(wcol.get() + kk * 16 + 8);
            for (int r = 0; r < rows; ++r) {
              const __m256 xb = _mm256_broadcast_ss(xr + r * k + kk);
              lo[r] = _mm256_fmadd_ps(xb, w0, lo[r]);
              hi[r] = _mm256_fmadd_ps(xb, w1, hi[r]);
            }
          }
        }
        for (int r = 0; r < rows; ++r) {
          _mm256_storeu_ps(a.yh + (r0 + r) * a.n + 16 * j, lo[r]);
          _mm256_storeu_ps(a.yh + (r0 + r) * a.n + 16 * j + 8, hi[r]);
        }
      }
    }
  }
};

template <int K, Exl3Codebook CB>
struct RunGemm {
  static void Run(const GemmArgs& a, int64_t j0, int64_t j1) {
    if (a.m == 1) {
      GemvKernel<K, CB>::Run(a, j0, j1);
    } else if (a.m <= kSmallM) {
      SmallMKernel<K, CB>::Run(a, j0, j1);
    } else {
      LargeMKernel<K, CB>::Run(a, j0, j1);
    }
  }
};

template <int K, Exl3Codebook CB>
struct DecodeTileToFp16 {
  static void Run(const uint16_t* tile, uint16_t* out, int64_t ld) {
    alignas(32) float f[256];
    DecodeTileGroupOrder<K, CB>(tile, f);
    for (int s = 0; s < 256; ++s) {
      const int cell = kCells.cell[s];
      out[(cell / 16) * ld + cell % 16] = _cvtss_sh(f[s], _MM_FROUND_TO_NEAREST_INT);
    }
  }
};

}  // namespace

void Exl3LinearCpu(const Exl3Weight& w, const float* x, int64_t m, float* y) { Exl3LinearCpu(w, x, m, y, Exl3Slice{}); }

void Exl3LinearCpu(const Exl3Weight& w, const float* x, int64_t m, float* y, const Exl3Slice& slice) {
  if (m <= 0) return;
  const int64_t in_begin = slice.in_begin, in_end = slice.in_end < 0 ? w.in_features : slice.in_end;
  const int64_t out_begin = slice.out_begin, out_end = slice.out_end < 0 ? w.out_features : slice.out_end;
  if (in_begin < 0 || in_begin >= in_end || in_end > w.in_features || out_begin < 0 || out_begin >= out_end ||
      out_end > w.out_features)
    throw std::invalid_argument("Exl3LinearCpu " + w.name + ": slice in [" + std::to_string(in_begin) + ", " +
                                std::to_string(in_end) + ") out [" + std::to_string(out_begin) + ", " +
                                std::to_string(out_end) + ") outside " + std::to_string(w.in_features) + " x " +
                                std::to_string(w.out_features));
  // Hadamard blocks touched on each side: only those strips / tile columns are decoded.
  const int64_t kb0 = in_begin / 128 * 128, kb1 = (in_end + 127) / 128 * 128;
  const int64_t nb0 = out_begin / 128 * 128, nb1 = (out_end + 127) / 128 * 128;
  const int64_t k = kb1 - kb0, n = nb1 - nb0, kin = in_end - in_begin, nout = out_end - out_begin;
  const uint16_t* suh16 = w.suh.as<uint16_t>() + kb0;
  const uint16_t* svh16 = w.svh.as<uint16_t>() + nb0;

  // 1. xh = (x ⊙ suh) Hk over the touched blocks, zero outside the slice.
  std::vector<float> xh(static_cast<size_t>(m * k), 0.0f);
  Exl3ParallelFor(m, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float* dst = &xh[r * k] + (in_begin - kb0);
      for (int64_t c = 0; c < kin; ++c) dst[c] = x[r * kin + c] * _cvtsh_ss(suh16[in_begin - kb0 + c]);
      Hadamard128Rows(&xh[r * k], 1, k, kHadamard128Scale);
    }
  });

  // 2. yh = xh Ŵ[block], tile columns split across threads.
  std::vector<float> yh(static_cast<size_t>(m * n));
  std::vector<float> xp;
  if (m <= kSmallM) xp = MakeLaneMultipliers(xh.data(), m, k);
  const int64_t tiles_n = w.n_padded() / 16;
  GemmArgs args{w.trellis.as<uint16_t>() + ((kb0 / 16) * tiles_n + nb0 / 16) * 16 * w.K, tiles_n, k, n, xp.data(),
                xh.data(), m, yh.data()};
  Exl3ParallelFor(n / 16, [&](int64_t j0, int64_t j1, int) { DispatchK<RunGemm>(w.K, w.codebook, args, j0, j1); });

  // 3. y = (yh Hn) ⊙ svh (+ bias), only the requested columns.
  std::vector<float> bias;
  if (w.bias && slice.add_bias) bias = ToFloatVector(*w.bias);
  Exl3ParallelFor(m, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float* src = &yh[r * n];
      Hadamard128Rows(src, 1, n, kHadamard128Scale);
      for (int64_t c = 0; c < nout; ++c) {
        const int64_t col = out_begin - nb0 + c;
        y[r * nout + c] = src[col] * _cvtsh_ss(svh16[col]) + (bias.empty() ? 0.0f : bias[out_begin + c]);
      }
    }
  });
}

std::vector<uint16_t> Exl3ReconstructFp16(const Exl3Weight& w) {
  const int64_t k = w.k_padded(), n = w.n_padded(), strips = k / 16, tiles_n = n / 16;
  std::vector<uint16_t> out(static_cast<size_t>(k * n));
  const uint16_t* trellis = w.trellis.as<uint16_t>();
  Exl3ParallelFor(strips * tiles_n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / tiles_n, j = t % tiles_n;
      DispatchK<DecodeTileToFp16>(w.K, w.codebook, trellis + t * 16 * w.K, &out[(16 * i) * n + 16 * j], n);
    }
  });
  return out;
}

std::vector<float> Exl3OriginalWeightF32(const Exl3Weight& w) {
  const int64_t k = w.k_padded(), n = w.n_padded();
  const std::vector<uint16_t> what = Exl3ReconstructFp16(w);
  const std::vector<float> suh = HalfVectorToFloat(w.suh), svh = HalfVectorToFloat(w.svh);
  // Hk Ŵ: transform columns (work on the transpose), then Ŵ Hn: transform rows.
  std::vector<float> t(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) t[c * k + r] = _cvtsh_ss(what[r * n + c]);
  Hadamard128Rows(t.data(), n, k, kHadamard128Scale);
  std::vector<float> out(static_cast<size_t>(k * n));
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) out[r * n + c] = t[c * k + r];
  Hadamard128Rows(out.data(), k, n, kHadamard128Scale);
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) out[r * n + c] *= suh[r] * svh[c];
  return out;
}

}  // namespace dsmesh

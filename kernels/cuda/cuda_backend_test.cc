// The CUDA backend against the CPU backend (the fp32 reference): every op of kernels/backend.h on the
// same random inputs, awkward sizes and the edge cases the forward meets (ring wrap-around, -1 padding,
// ties, tensor-parallel slices, both MoE paths). f32 ops must agree to ~1e-5 relative L2; EXL3 linears to
// 2e-3 (the GPU feeds fp16 activations to the EXL3 kernels); copies, index outputs and single adds must
// be identical. Without a GPU every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/kv_rows.h"

namespace dsmesh {
namespace {

namespace fs = std::filesystem;

constexpr double kF32Tol = 1e-5;   // rel L2 of f32 ops (summation order, expf/sinf ulps)
constexpr double kExl3Tol = 2e-3;  // rel L2 of EXL3 linears (fp16 activations on the GPU)
// rel L2 of prefill attention on tensor cores with fp16 operands (prefill_attention kMmaFp16):
// q, keys and probabilities rounded to fp16 (relative error 2^-11 each), fp32 sums; ~4e-4 expected at
// unit-variance inputs (printed per case by PrefillAttentionOnTensorCores). The default high + low parts
// are held to kF32Tol.
constexpr double kPrefillAttnFp16Tol = 2e-3;

// One tensor on both backends: c in CPU (host) memory, g in CUDA memory, same values.
struct Pair {
  Tensor c, g;
};
struct LinPair {
  LinearWeight c, g;
};
struct ExpertSet {
  std::vector<ExpertWeights> c, g;
};

void FillHost(Tensor* t, const std::function<float()>& draw) {
  for (int64_t i = 0; i < t->numel(); ++i) {
    const float v = draw();
    switch (t->dtype) {
      case DType::kF32: t->as<float>()[i] = v; break;
      case DType::kBF16: t->as<uint16_t>()[i] = FloatToBf16(v); break;
      case DType::kF16: t->as<uint16_t>()[i] = FloatToFp16(v); break;
      case DType::kI32: t->as<int32_t>()[i] = static_cast<int32_t>(v); break;
      default: throw std::runtime_error("FillHost: dtype");
    }
  }
}

// Random EXL3 linears written as a one-shard checkpoint, the form LoadExl3Linear reads them in.
class Exl3Checkpoint {
 public:
  explicit Exl3Checkpoint(uint32_t seed) : rng_(seed) {}
  void Add(const std::string& prefix, int64_t k, int64_t n, int K, Exl3Codebook cb, bool bias) {
    const Exl3Weight w = testing::RandomExl3Weight(k, n, K, cb, rng_);
    writer_.Add(prefix + ".trellis", w.trellis);
    writer_.Add(prefix + ".suh", w.suh);
    writer_.Add(prefix + ".svh", w.svh);
    if (cb == Exl3Codebook::kMcg) {
      Tensor m = AllocateTensor(DType::kI32, {});
      *m.as<uint32_t>() = kExl3McgMultiplier;
      writer_.Add(prefix + ".mcg", m);
    }
    if (bias) {
      Tensor b = AllocateTensor(DType::kF16, {n});
      std::normal_distribution<float> nd(0.0f, 0.5f);
      FillHost(&b, [&] { return nd(rng_); });
      writer_.Add(prefix + ".bias", b);
    }
  }
  Checkpoint Write() {
    const fs::path dir = fs::path(::testing::TempDir()) /
                         (std::string("cuda_backend_test_") +
                          ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                          std::to_string(written++));
    fs::remove_all(dir);
    fs::create_directories(dir);
    writer_.Write((dir / "model.safetensors").string());
    return Checkpoint::Open(dir.string());
  }

 private:
  std::mt19937 rng_;
  SafetensorsWriter writer_;
  static inline int written = 0;  // one directory per checkpoint: earlier ones stay mapped
};

class CudaBackendTest : public ::testing::Test {
 protected:
  // Made on first use, after DSMESH_REQUIRE_GPU: MakeCudaBackend throws without a GPU. A fresh backend
  // per test keeps its host-address caches (rope tables, tid2eid, fused MoE layers) from seeing another
  // test's freed buffers.
  Backend& gpu() {
    if (!gpu_) gpu_ = MakeCudaBackend(0);
    return *gpu_;
  }

  Tensor HostRand(DType dt, std::vector<int64_t> shape, float scale = 1.0f, bool fp16_exact = false) {
    Tensor t = AllocateTensor(dt, std::move(shape));
    std::normal_distribution<float> nd(0.0f, scale);
    FillHost(&t, [&] { return fp16_exact ? Fp16ToFloat(FloatToFp16(nd(rng_))) : nd(rng_); });
    return t;
  }
  // CPU Upload returns the same host view, so c is the host tensor itself and CPU ops write into it.
  Pair Both(const Tensor& host) { return {cpu_->Upload(host), gpu().Upload(host)}; }
  Pair Rand(std::vector<int64_t> shape, float scale = 1.0f, bool fp16_exact = false) {
    return Both(HostRand(DType::kF32, std::move(shape), scale, fp16_exact));
  }
  // Values step * {-levels..levels}: dot products of these are exact in f32 whatever the summation order,
  // so rankings built on them must agree exactly (and tie often).
  Pair Grid(std::vector<int64_t> shape, int levels, float step) {
    Tensor t = AllocateTensor(DType::kF32, std::move(shape));
    std::uniform_int_distribution<int> ud(-levels, levels);
    FillHost(&t, [&] { return step * ud(rng_); });
    return Both(t);
  }
  Pair Ints(std::vector<int64_t> shape, int lo, int hi) {
    Tensor t = AllocateTensor(DType::kI32, std::move(shape));
    std::uniform_int_distribution<int> ud(lo, hi);
    FillHost(&t, [&] { return static_cast<float>(ud(rng_)); });
    return Both(t);
  }
  Pair Zeros(DType dt, std::vector<int64_t> shape) { return {cpu_->Alloc(dt, shape), gpu().Alloc(dt, shape)}; }
  // The rows of `rows` [n, dim] spread over a pool of blocks of `per` rows, listed in reverse order after
  // one unused block, as a sequence's entries sit in the state pool.
  struct PagedPair {
    Pair pool;
    std::vector<int32_t> table;
    PagedRows c, g;
  };
  // f32 rows [n, dim] in a paged pool of `per` rows per block whose table runs backwards, stored as
  // `storage` (kernels/kv_rows.h: F32, BF16, or U8 for the fp8 layout with rope_dim bf16 values).
  std::unique_ptr<PagedPair> Paged(const Tensor& rows, int64_t per, DType storage = DType::kF32,
                                   int64_t rope_dim = 0) {
    auto p = std::make_unique<PagedPair>();
    const int64_t n = rows.shape[0], dim = rows.numel() / std::max<int64_t>(n, 1), blocks = (n + per - 1) / per;
    const int64_t bytes = KvRowBytes(storage, dim, rope_dim);
    const int64_t width = storage == DType::kU8 ? bytes : dim;
    Tensor pool = AllocateTensor(storage, {(blocks + 1) * per, width});
    for (int64_t j = 0; j < blocks; ++j) p->table.push_back(static_cast<int32_t>(blocks - j));
    for (int64_t e = 0; e < n; ++e)
      EncodeKvRows(rows.as<float>() + e * dim, 1, dim, rope_dim, storage,
                   static_cast<uint8_t*>(pool.data) + (p->table[e / per] * per + e % per) * bytes);
    p->pool = Both(pool);
    p->c = PagedRows{&p->pool.c, per, p->table.data(), blocks, rope_dim};
    p->g = PagedRows{&p->pool.g, per, p->table.data(), blocks, rope_dim};
    return p;
  }
  // A separate copy of p.c on both backends (the "before" of an in-place op).
  Pair Copy(const Pair& p) {
    Tensor h = AllocateTensor(p.c.dtype, p.c.shape);
    std::memcpy(h.data, p.c.data, p.c.nbytes());
    return Both(h);
  }

  std::vector<uint8_t> GpuBytes(const Tensor& g) {
    std::vector<uint8_t> b(g.nbytes());
    gpu().ToHost(g, b.data());
    return b;
  }

  // rel L2 <= tol and the largest elementwise error <= 10 * tol of the reference's largest magnitude;
  // with `base`, both sides have base subtracted first (to judge what an accumulating op added).
  void ExpectClose(const Pair& p, double tol, const std::string& what, const Pair* base = nullptr) {
    ASSERT_EQ(p.c.dtype, DType::kF32) << what;
    ASSERT_EQ(p.c.numel(), p.g.numel()) << what;
    const std::vector<uint8_t> gb = GpuBytes(p.g);
    const float* g = reinterpret_cast<const float*>(gb.data());
    const float* c = p.c.as<float>();
    const float* b = base ? base->c.as<float>() : nullptr;
    double num = 0, den = 0, max_err = 0, max_ref = 0;
    int64_t worst = 0;
    for (int64_t i = 0; i < p.c.numel(); ++i) {
      const double r = static_cast<double>(c[i]) - (b ? b[i] : 0.0), x = static_cast<double>(g[i]) - (b ? b[i] : 0.0);
      const double e = std::fabs(x - r);
      if (!(e <= max_err)) max_err = e, worst = i;  // also catches NaN
      num += e * e;
      den += r * r;
      max_ref = std::max(max_ref, std::fabs(r));
    }
    const double rel = std::sqrt(num / std::max(den, 1e-300));
    EXPECT_LE(rel, tol) << what << ": rel L2 (numel " << p.c.numel() << ")";
    EXPECT_LE(max_err, 10 * tol * std::max(max_ref, 1e-30))
        << what << ": worst element " << worst << " cpu " << c[worst] << " cuda " << g[worst];
  }

  void ExpectSame(const Pair& p, const std::string& what) {
    ASSERT_EQ(p.c.nbytes(), p.g.nbytes()) << what;
    const std::vector<uint8_t> gb = GpuBytes(p.g);
    if (std::memcmp(gb.data(), p.c.data, gb.size()) == 0) return;
    const size_t es = DTypeSize(p.c.dtype);
    for (size_t i = 0; i < gb.size(); i += es)
      if (std::memcmp(gb.data() + i, static_cast<const char*>(p.c.data) + i, es) != 0) {
        if (p.c.dtype == DType::kI32) {
          int32_t gv;
          std::memcpy(&gv, gb.data() + i, 4);
          ADD_FAILURE() << what << ": first difference at element " << i / es << " (row width "
                        << p.c.numel() / std::max<int64_t>(p.c.shape[0], 1) << "): cpu "
                        << p.c.as<int32_t>()[i / es] << " cuda " << gv;
        } else {
          ADD_FAILURE() << what << ": first difference at element " << i / es;
        }
        return;
      }
  }

  LinPair Dense(int64_t out, int64_t in, DType dt, bool bias, float scale = 0.2f) {
    const Tensor w = HostRand(dt, {out, in}, scale);
    LinPair l;
    for (LinearWeight* lw : {&l.c, &l.g}) lw->name = "dense", lw->in = in, lw->out = out;
    l.c.dense = w;
    l.g.dense = gpu().Upload(w);
    if (bias) {
      const Tensor b = HostRand(DType::kF32, {out});
      l.c.bias = b;
      l.g.bias = gpu().Upload(b);
    }
    return l;
  }
  LinPair Exl3(const Checkpoint& ck, const std::string& prefix, int64_t out, int64_t in, int64_t o0, int64_t o1,
               int64_t i0, int64_t i1) {
    return {cpu_->LoadExl3Linear(ck, prefix, out, in, o0, o1, i0, i1),
            gpu().LoadExl3Linear(ck, prefix, out, in, o0, o1, i0, i1)};
  }
  ExpertSet DenseExperts(int E, int64_t D, int64_t I, DType dt) {
    ExpertSet s;
    for (int e = 0; e < E; ++e) {
      LinPair w1 = Dense(I, D, dt, false), w3 = Dense(I, D, dt, false), w2 = Dense(D, I, dt, false, 0.1f);
      s.c.push_back({w1.c, w3.c, w2.c});
      s.g.push_back({w1.g, w3.g, w2.g});
    }
    return s;
  }
  ExpertSet Exl3Experts(int E, int64_t D, int64_t I, int K, Exl3Codebook cb) {
    Exl3Checkpoint w(static_cast<uint32_t>(rng_()));
    auto p = [](int e, const char* part) { return "experts." + std::to_string(e) + "." + part; };
    for (int e = 0; e < E; ++e) {
      w.Add(p(e, "w1"), D, I, K, cb, false);
      w.Add(p(e, "w3"), D, I, K, cb, false);
      w.Add(p(e, "w2"), I, D, K, cb, false);
    }
    const Checkpoint ck = w.Write();
    ExpertSet s;
    for (int e = 0; e < E; ++e) {
      LinPair w1 = Exl3(ck, p(e, "w1"), I, D, 0, I, 0, D), w3 = Exl3(ck, p(e, "w3"), I, D, 0, I, 0, D),
              w2 = Exl3(ck, p(e, "w2"), D, I, 0, D, 0, I);
      s.c.push_back({w1.c, w3.c, w2.c});
      s.g.push_back({w1.g, w3.g, w2.g});
    }
    return s;
  }
  // Routing of n rows to k distinct experts of E with weights in [0.1, 1].
  std::pair<Pair, Pair> Routing(int64_t n, int k, int E) {
    Tensor idx = AllocateTensor(DType::kI32, {n, k}), wt = AllocateTensor(DType::kF32, {n, k});
    std::uniform_real_distribution<float> ud(0.1f, 1.0f);
    std::vector<int32_t> all(E);
    for (int64_t r = 0; r < n; ++r) {
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng_);
      for (int i = 0; i < k; ++i) idx.as<int32_t>()[r * k + i] = all[i], wt.as<float>()[r * k + i] = ud(rng_);
    }
    return {Both(idx), Both(wt)};
  }

  std::shared_ptr<Backend> cpu_ = MakeCpuBackend();
  std::shared_ptr<Backend> gpu_;
  std::mt19937 rng_{20240611};
};

TEST_F(CudaBackendTest, MemoryAllocCopyRowsAndTransfers) {
  DSMESH_REQUIRE_GPU();
  Tensor z = gpu().Alloc(DType::kF32, {7, 9});
  std::vector<float> zh(63, 1.0f);
  gpu().ToHost(z, zh.data());
  for (float v : zh) ASSERT_EQ(v, 0.0f) << "Alloc must zero-fill";

  Pair a = Rand({12, 33});
  std::vector<float> back(a.c.numel());
  gpu().ToHost(a.g, back.data());
  EXPECT_EQ(0, std::memcmp(back.data(), a.c.data, a.c.nbytes())) << "Upload/ToHost";
  Tensor h = HostRand(DType::kF32, {12, 33});
  gpu().FromHost(h.data, &a.g);
  std::memcpy(a.c.data, h.data, h.nbytes());
  ExpectSame(a, "FromHost");

  for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) {
    Pair src = Both(HostRand(dt, {10, 17}, 5.0f)), dst = Both(HostRand(dt, {8, 17}, 5.0f));
    cpu_->CopyRows(src.c, 3, &dst.c, 2, 5);
    gpu().CopyRows(src.g, 3, &dst.g, 2, 5);
    ExpectSame(dst, std::string("CopyRows ") + DTypeName(dt));
    // Overlapping rows of one tensor (memmove semantics), both directions.
    cpu_->CopyRows(src.c, 1, &src.c, 3, 6);
    gpu().CopyRows(src.g, 1, &src.g, 3, 6);
    cpu_->CopyRows(src.c, 4, &src.c, 2, 5);
    gpu().CopyRows(src.g, 4, &src.g, 2, 5);
    ExpectSame(src, std::string("CopyRows overlapping ") + DTypeName(dt));
  }
}

// Many row copies in one launch: 16-byte words where the copy allows them, bytes where it does not (5-byte
// rows), into several destinations; equal to the CPU's CopyRows one by one.
TEST_F(CudaBackendTest, CopyRowsBatch) {
  DSMESH_REQUIRE_GPU();
  Pair src = Rand({40, 64}), a = Rand({19, 64}), b = Rand({7, 64});
  Tensor bytes_src = AllocateTensor(DType::kU8, {12, 5}), bytes_dst = AllocateTensor(DType::kU8, {9, 5});
  for (int64_t i = 0; i < bytes_src.numel(); ++i) static_cast<uint8_t*>(bytes_src.data)[i] = static_cast<uint8_t>(i * 37);
  std::memset(bytes_dst.data, 0, bytes_dst.nbytes());
  Pair bs = Both(bytes_src), bd = Both(bytes_dst);
  auto copies = [](Pair& s, Pair& x, Pair& y, Pair& p, Pair& q, bool gpu) {
    auto T = [gpu](Pair& t) { return gpu ? &t.g : &t.c; };
    return std::vector<Backend::RowCopy>{{T(s), 3, T(x), 17, 2}, {T(s), 0, T(x), 0, 5}, {T(s), 39, T(y), 6, 1},
                                         {T(s), 10, T(y), 0, 4}, {T(p), 2, T(q), 4, 5}, {T(p), 0, T(q), 0, 1}};
  };
  cpu_->CopyRowsBatch(copies(src, a, b, bs, bd, false));
  gpu().CopyRowsBatch(copies(src, a, b, bs, bd, true));
  ExpectSame(a, "CopyRowsBatch a");
  ExpectSame(b, "CopyRowsBatch b");
  ExpectSame(bd, "CopyRowsBatch 5-byte rows");
}

TEST_F(CudaBackendTest, Embedding) {
  DSMESH_REQUIRE_GPU();
  const std::vector<int32_t> tokens = {0, 999, 17, 17, 500, 3, 998};
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    Pair table = Both(HostRand(dt, {1000, 100}));
    Pair out = Zeros(DType::kF32, {7, 100});
    cpu_->Embedding(table.c, tokens.data(), 7, &out.c);
    gpu().Embedding(table.g, tokens.data(), 7, &out.g);
    ExpectSame(out, std::string("Embedding ") + DTypeName(dt));
  }
}

TEST_F(CudaBackendTest, RmsNormAddScale) {
  DSMESH_REQUIRE_GPU();
  for (int64_t dim : {64, 37, 1024, 4096, 16384, 20000}) {
    Pair x = Rand({5, 3 * dim}, 2.0f), w = Rand({dim}), out = Zeros(DType::kF32, {5, 3 * dim});
    for (bool weighted : {true, false}) {
      cpu_->RmsNorm(x.c, dim, weighted ? &w.c : nullptr, 1e-6f, &out.c);
      gpu().RmsNorm(x.g, dim, weighted ? &w.g : nullptr, 1e-6f, &out.g);
      ExpectClose(out, kF32Tol, "RmsNorm dim " + std::to_string(dim) + (weighted ? " weighted" : " unweighted"));
    }
    cpu_->RmsNorm(x.c, dim, &w.c, 1e-6f, &x.c);  // in place
    gpu().RmsNorm(x.g, dim, &w.g, 1e-6f, &x.g);
    ExpectClose(x, kF32Tol, "RmsNorm in place dim " + std::to_string(dim));
  }
  Pair a = Rand({9, 301}), acc = Rand({9, 301});
  cpu_->Add(a.c, &acc.c);
  gpu().Add(a.g, &acc.g);
  ExpectSame(acc, "Add");
  cpu_->Scale(&acc.c, -0.37f);
  gpu().Scale(&acc.g, -0.37f);
  ExpectSame(acc, "Scale");
}

TEST_F(CudaBackendTest, DenseLinear) {
  DSMESH_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{100, 37}, {256, 512}, {7, 1}, {256, 4096}, {64, 4096}})
      for (bool bias : {true, false}) {
        const LinPair w = Dense(out, in, dt, bias);
        for (int64_t m : {1, 5, 8, 9, 16, 70}) {
          Pair x = Rand({m, in}), y = Zeros(DType::kF32, {m, out});
          cpu_->Linear(x.c, w.c, &y.c);
          gpu().Linear(x.g, w.g, &y.g);
          ExpectClose(y, kF32Tol, std::string("Linear ") + DTypeName(dt) + " " + std::to_string(out) + "x" +
                                      std::to_string(in) + (bias ? " bias" : "") + " m=" + std::to_string(m));
        }
      }
}

TEST_F(CudaBackendTest, DenseGroupedLinear) {
  DSMESH_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF32})
    for (auto [groups, in, out] : {std::tuple<int, int64_t, int64_t>{4, 37, 100}, {8, 128, 1024}}) {
      const LinPair w = Dense(out, in, dt, false);
      for (int64_t m : {1, 5, 9, 70}) {
        Pair x = Rand({m, groups * in}), y = Zeros(DType::kF32, {m, out});
        cpu_->GroupedLinear(x.c, w.c, groups, &y.c);
        gpu().GroupedLinear(x.g, w.g, groups, &y.g);
        ExpectClose(y, kF32Tol, std::string("GroupedLinear ") + DTypeName(dt) + " groups " + std::to_string(groups) +
                                    " m=" + std::to_string(m));
      }
    }
}

TEST_F(CudaBackendTest, RopeForwardAndInverse) {
  DSMESH_REQUIRE_GPU();
  const std::vector<int64_t> positions = {0, 1, 7, 4095, 65537, 300000, 1048575};
  const int64_t n = positions.size(), heads = 4, head_dim = 96, rope_dim = 64;
  std::vector<float> inv_freq(rope_dim / 2);
  for (int64_t i = 0; i < rope_dim / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / rope_dim);
  for (bool inverse : {false, true}) {
    Pair x = Rand({n, heads * head_dim});
    cpu_->Rope(&x.c, heads, head_dim, rope_dim, positions.data(), inv_freq, inverse);
    gpu().Rope(&x.g, heads, head_dim, rope_dim, positions.data(), inv_freq, inverse);
    ExpectClose(x, kF32Tol, inverse ? "Rope inverse" : "Rope");
  }
}

TEST_F(CudaBackendTest, HyperConnections) {
  DSMESH_REQUIRE_GPU();
  const int hc = 4, iters = 20;
  const int64_t n = 5, D = 160;
  const float eps = 1e-6f, norm_eps = 1e-6f;
  // V4-Flash's width (one row: 16 mixes per pass; a decode batch: 4 rows per cluster, a partial group at
  // 5 and 6 rows), twice its width (two units per thread), and small odd shapes: hc = 3 (15 mixes per row),
  // hc = 5 (25 cells, the largest one-warp normalisation), hc = 6 (36 cells, the block-wide one), D = 150
  // (not a multiple of 4: scalar loads), D = 12 (some blocks of the cluster own no columns).
  const struct {
    int hc;
    int64_t n, D;
  } pre_cases[] = {{4, 5, 160}, {4, 1, 4096}, {4, 4, 4096}, {4, 6, 4096}, {4, 16, 4096}, {4, 1, 8192},
                   {4, 5, 8192}, {3, 3, 200}, {5, 2, 96}, {6, 2, 640}, {4, 3, 150}, {4, 2, 12}};
  for (const auto& pc : pre_cases) {
    const std::string what = "HcPre hc=" + std::to_string(pc.hc) + " n=" + std::to_string(pc.n) +
                             " D=" + std::to_string(pc.D) + ": ";
    Pair X = Rand({pc.n, pc.hc * pc.D});
    Pair fn = Rand({(2 + pc.hc) * pc.hc, pc.hc * pc.D}, 0.05f), base = Rand({(2 + pc.hc) * pc.hc}, 0.5f);
    Pair scale = Rand({3});
    Pair y = Zeros(DType::kF32, {pc.n, pc.D}), post = Zeros(DType::kF32, {pc.n, pc.hc}),
         comb = Zeros(DType::kF32, {pc.n, pc.hc * pc.hc});
    cpu_->HcPre(X.c, fn.c, base.c, scale.c, pc.hc, iters, eps, norm_eps, &y.c, &post.c, &comb.c);
    gpu().HcPre(X.g, fn.g, base.g, scale.g, pc.hc, iters, eps, norm_eps, &y.g, &post.g, &comb.g);
    ExpectClose(y, kF32Tol, what + "y");
    ExpectClose(post, kF32Tol, what + "post");
    ExpectClose(comb, kF32Tol, what + "comb");
    // With y's RmsNorm in the same launch (the CPU backend runs HcPre, then RmsNorm); one shape unweighted.
    const bool weighted = pc.D != 160;
    Pair norm_w = Rand({pc.D}, 1.0f), yn = Zeros(DType::kF32, {pc.n, pc.D});
    cpu_->HcPreNorm(X.c, fn.c, base.c, scale.c, pc.hc, iters, eps, norm_eps, weighted ? &norm_w.c : nullptr, 1e-5f,
                    &yn.c, &post.c, &comb.c);
    gpu().HcPreNorm(X.g, fn.g, base.g, scale.g, pc.hc, iters, eps, norm_eps, weighted ? &norm_w.g : nullptr, 1e-5f,
                    &yn.g, &post.g, &comb.g);
    ExpectClose(yn, kF32Tol, what + "normed y");
    ExpectClose(post, kF32Tol, what + "post (HcPreNorm)");
    ExpectClose(comb, kF32Tol, what + "comb (HcPreNorm)");
  }
  {  // A row's normed y, post and comb are the same bits alone as in a batch (decode batches rely on it).
    const int64_t rows = 6, W = 4096;
    Pair X = Rand({rows, hc * W});
    Pair fn = Rand({(2 + hc) * hc, hc * W}, 0.05f), base = Rand({(2 + hc) * hc}, 0.5f), scale = Rand({3});
    Tensor y = gpu().Alloc(DType::kF32, {rows, W}), post = gpu().Alloc(DType::kF32, {rows, hc}),
           comb = gpu().Alloc(DType::kF32, {rows, hc * hc});
    Pair norm_w = Rand({W}, 1.0f);
    gpu().HcPreNorm(X.g, fn.g, base.g, scale.g, hc, iters, eps, norm_eps, &norm_w.g, 1e-5f, &y, &post, &comb);
    const std::vector<uint8_t> all[3] = {GpuBytes(y), GpuBytes(post), GpuBytes(comb)};
    for (int64_t r : {0, 5}) {
      Tensor xr = AllocateTensor(DType::kF32, {1, hc * W});
      std::memcpy(xr.data, X.c.as<float>() + r * hc * W, xr.nbytes());
      Tensor y1 = gpu().Alloc(DType::kF32, {1, W}), post1 = gpu().Alloc(DType::kF32, {1, hc}),
             comb1 = gpu().Alloc(DType::kF32, {1, hc * hc});
      gpu().HcPreNorm(gpu().Upload(xr), fn.g, base.g, scale.g, hc, iters, eps, norm_eps, &norm_w.g, 1e-5f, &y1, &post1,
                      &comb1);
      const std::vector<uint8_t> one[3] = {GpuBytes(y1), GpuBytes(post1), GpuBytes(comb1)};
      for (int o = 0; o < 3; ++o)
        EXPECT_EQ(std::memcmp(one[o].data(), all[o].data() + r * one[o].size(), one[o].size()), 0)
            << "HcPre row " << r << " alone != in a batch of " << rows << " (" << (o == 0 ? "y" : o == 1 ? "post" : "comb")
            << ")";
    }
  }

  Pair X = Rand({n, hc * D});
  Pair post = Rand({n, hc}, 1.0f), comb = Rand({n, hc * hc}, 0.5f);

  Pair h = Rand({n, D}), Xe = Zeros(DType::kF32, {n, hc * D});
  cpu_->HcExpand(h.c, hc, &Xe.c);
  gpu().HcExpand(h.g, hc, &Xe.g);
  ExpectSame(Xe, "HcExpand");

  // HcPost on the CPU's post/comb (the same values on both sides).
  Pair post_in = Copy(post), comb_in = Copy(comb), f = Rand({n, D}), out = Zeros(DType::kF32, {n, hc * D});
  cpu_->HcPost(X.c, f.c, post_in.c, comb_in.c, hc, &out.c);
  gpu().HcPost(X.g, f.g, post_in.g, comb_in.g, hc, &out.g);
  ExpectClose(out, kF32Tol, "HcPost");

  Pair hfn = Rand({hc, hc * D}, 0.05f), hbase = Rand({hc}, 0.5f), hscale = Rand({1});
  Pair hy = Zeros(DType::kF32, {n, D});
  cpu_->HcHead(X.c, hfn.c, hbase.c, hscale.c, hc, eps, norm_eps, &hy.c);
  gpu().HcHead(X.g, hfn.g, hbase.g, hscale.g, hc, eps, norm_eps, &hy.g);
  ExpectClose(hy, kF32Tol, "HcHead");
}

TEST_F(CudaBackendTest, CompressorPositionBiasAndPool) {
  DSMESH_REQUIRE_GPU();
  for (auto [ratio, first_pos, n, width] : {std::tuple<int, int64_t, int64_t, int64_t>{4, 6, 9, 64}, {128, 300, 5, 48}}) {
    Pair score = Rand({n, width}), ape = Rand({ratio, width});
    std::vector<int64_t> positions;
    for (int64_t r = 0; r < n; ++r) positions.push_back(first_pos + (r % 3 == 2 ? 1000 + 7 * r : r));  // two sequences' rows
    cpu_->AddPositionBias(&score.c, ape.c, positions.data(), ratio);
    gpu().AddPositionBias(&score.g, ape.g, positions.data(), ratio);
    ExpectSame(score, "AddPositionBias ratio " + std::to_string(ratio));
  }
  struct Case {
    int ratio;
    bool overlap;
    int64_t d, base_pos, first_window, num_windows;
  };
  for (const Case& k : {Case{4, true, 32, 8, 3, 4}, Case{4, true, 32, 0, 0, 5}, Case{4, true, 512, 0, 1, 2},
                        Case{128, false, 48, 200, 2, 3}, Case{128, false, 48, 0, 0, 1}}) {
    const int64_t width = (k.overlap ? 2 : 1) * k.d;
    const int64_t rows = (k.first_window + k.num_windows) * k.ratio - k.base_pos + 3;  // a few spare rows
    Pair kv = Rand({rows, width}), score = Rand({rows, width}, 2.0f), out = Zeros(DType::kF32, {k.num_windows, k.d});
    cpu_->CompressorPool(kv.c, score.c, k.base_pos, k.first_window, k.num_windows, k.ratio, k.overlap, k.d, &out.c);
    gpu().CompressorPool(kv.g, score.g, k.base_pos, k.first_window, k.num_windows, k.ratio, k.overlap, k.d, &out.g);
    ExpectClose(out, kF32Tol, "CompressorPool ratio " + std::to_string(k.ratio) + (k.overlap ? " overlap" : "") +
                                  " first_window " + std::to_string(k.first_window) + " base_pos " +
                                  std::to_string(k.base_pos));
  }
}

// One compressor step for several sequences (Backend::CompressorStep; one launch when every sequence can
// complete at most 4 windows, else two): the entries it emits (pooled, normed, roped, stored as f32 / bf16 /
// fp8) and the rings it leaves against the CPU, which runs CompressorPool, RmsNorm, Rope and StoreKvRows.
// Sequences that complete a window, several, or none; rows before `start` read from the ring (wrapped);
// the decode shapes of V4-Flash (one row: entry width 512 at ratio 4 and 128, the indexer's 128 at ratio 4);
// steps of 15 and 16 rows (the last of one launch, the first of two; 15 rows overwrite ring slots the same
// step pools from); a prefill-sized step of one sequence; each with the position bias added before the
// step or by it (CompressorSpec::ape).
TEST_F(CudaBackendTest, CompressorStepEqualsCpu) {
  DSMESH_REQUIRE_GPU();
  struct Case {
    int ratio;
    bool overlap;
    int64_t dim, rope;
    std::vector<std::pair<int64_t, int64_t>> seqs;  // (start, count)
  };
  const std::vector<Case> cases = {
      {4, true, 64, 16, {{37, 1}, {3, 1}, {4001, 4}, {610, 4}}},
      {4, true, 512, 64, {{7, 1}, {0, 4}, {20, 3}}},
      {128, false, 64, 16, {{255, 1}, {1000, 4}, {127, 2}}},
      {4, true, 64, 16, {{13, 37}}},
      {128, false, 48, 16, {{100, 300}}},
      {4, true, 512, 64, {{4095, 1}, {4096, 1}, {4094, 1}}},
      {128, false, 512, 64, {{4095, 1}, {4223, 1}, {4100, 1}}},
      {4, true, 128, 64, {{4095, 1}, {61, 4}}},
      {4, true, 64, 16, {{4001, 15}, {2, 15}}},
      {4, true, 64, 16, {{4003, 16}, {9, 16}}},
  };
  for (const Case& k : cases)
    for (DType storage : {DType::kF32, DType::kBF16, DType::kU8})
    for (bool with_ape : {false, true}) {
      std::vector<float> inv_freq(k.rope / 2);
      for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / k.rope);
      const int64_t width = (k.overlap ? 2 : 1) * k.dim, slots = (k.overlap ? 2 : 1) * k.ratio + 4;
      int64_t n = 0;
      for (auto [start, count] : k.seqs) n += count;
      Pair kv = Rand({n, width}), score = Rand({n, width}, 2.0f), norm = Rand({k.dim}, 0.5f);
      std::vector<Pair> ring_kv, ring_score;
      std::vector<std::unique_ptr<PagedPair>> paged;
      for (auto [start, count] : k.seqs) {
        ring_kv.push_back(Rand({slots, width}));
        ring_score.push_back(Rand({slots, width}, 2.0f));
        const int64_t capacity = (start + count) / k.ratio + 3;
        paged.push_back(Paged(AllocateTensor(DType::kF32, {capacity, k.dim}), 8, storage,
                              storage == DType::kU8 ? k.rope : 0));
      }
      std::vector<Backend::CompressorSeq> cs, gs;
      int64_t offset = 0;
      for (size_t i = 0; i < k.seqs.size(); ++i) {
        const auto [start, count] = k.seqs[i];
        cs.push_back({offset, count, start, start / k.ratio, &ring_kv[i].c, &ring_score[i].c, &paged[i]->c});
        gs.push_back({offset, count, start, start / k.ratio, &ring_kv[i].g, &ring_score[i].g, &paged[i]->g});
        offset += count;
      }
      Backend::CompressorSpec spec;
      spec.ratio = k.ratio;
      spec.overlap = k.overlap;
      spec.dim = k.dim;
      spec.rope_dim = k.rope;
      spec.eps = 1e-6f;
      spec.inv_freq = &inv_freq;
      spec.norm = &norm.c;
      // With ape the score rows come without their position bias and the step adds it (the CPU: AddPositionBias
      // on a copy, then the same op).
      const Pair ape = Rand({k.ratio, width}, 0.5f);
      spec.ape = with_ape ? &ape.c : nullptr;
      cpu_->CompressorStep(kv.c, score.c, spec, cs);
      spec.norm = &norm.g;
      spec.ape = with_ape ? &ape.g : nullptr;
      gpu().CompressorStep(kv.g, score.g, spec, gs);
      const std::string what = "CompressorStep ratio " + std::to_string(k.ratio) + " dim " + std::to_string(k.dim) +
                               " rows " + std::to_string(n) + " " + DTypeName(storage) + (with_ape ? " +ape" : "");
      for (size_t i = 0; i < k.seqs.size(); ++i) {
        ExpectSame(ring_kv[i], what + ": kv ring of sequence " + std::to_string(i));
        ExpectSame(ring_score[i], what + ": score ring of sequence " + std::to_string(i));
        // Every pool row (written or not), decoded to f32 on both sides.
        const Tensor& pc = paged[i]->pool.c;
        const int64_t rows = pc.shape[0], rope = storage == DType::kU8 ? k.rope : 0;
        Tensor dc = AllocateTensor(DType::kF32, {rows, k.dim}), dg = AllocateTensor(DType::kF32, {rows, k.dim});
        const std::vector<uint8_t> gb = GpuBytes(paged[i]->pool.g);
        DecodeKvRows(pc.data, rows, k.dim, rope, storage, dc.as<float>());
        DecodeKvRows(gb.data(), rows, k.dim, rope, storage, dg.as<float>());
        Pair both{dc, gpu().Upload(dg)};
        // f32 rows to f32 rounding; bf16 / fp8 rows as far as one rounding step of the stored form.
        const double tol = storage == DType::kF32 ? kF32Tol : storage == DType::kBF16 ? 4e-3 : 3e-2;
        ExpectClose(both, tol, what + ": entries of sequence " + std::to_string(i));
      }
    }
}

// Rows into rings for several rings at once, wrapping at the ring's end (Backend::RingWriteBatch).
TEST_F(CudaBackendTest, RingWriteBatch) {
  DSMESH_REQUIRE_GPU();
  Pair src = Rand({12, 40}), a = Rand({19, 40}), b = Rand({7, 40});
  for (Backend* be : {cpu_.get(), &gpu()}) {
    const bool g = be != cpu_.get();
    be->RingWriteBatch({{g ? &src.g : &src.c, 0, 17, 5, g ? &a.g : &a.c},    // slots 17, 18, 0, 1, 2
                        {g ? &src.g : &src.c, 5, 3, 7, g ? &b.g : &b.c},     // every slot, from 3
                        {g ? &src.g : &src.c, 11, 41, 1, g ? &a.g : &a.c}});  // slot 3
  }
  ExpectSame(a, "RingWriteBatch ring a");
  ExpectSame(b, "RingWriteBatch ring b");
}

TEST_F(CudaBackendTest, IndexerTopK) {
  DSMESH_REQUIRE_GPU();
  struct Case {
    const char* what;
    int64_t num_keys;
    int top_k;
    std::vector<int64_t> positions;
    int distinct_keys;  // keys repeat with this period (0 = all random): exact duplicate scores
  };
  const int64_t heads = 8, dim = 64;
  const int ratio = 4;
  for (const Case& k : {Case{"fewer keys than top_k", 5, 16, {2, 9, 100}, 0},
                        Case{"20000 keys, partly visible", 20000, 512, {80003, 79999, 40000, 2047, 1000, 3}, 0},
                        Case{"duplicate keys (ties)", 3000, 100, {12003, 12003, 5000, 401}, 40}}) {
    const int64_t n = k.positions.size();
    Pair q = Grid({n, heads * dim}, 4, 0.25f), w = Grid({n, heads}, 8, 0.125f);
    Pair keys = Grid({k.num_keys, dim}, 4, 0.25f);
    if (k.distinct_keys > 0) {
      float* kc = keys.c.as<float>();
      for (int64_t i = k.distinct_keys; i < k.num_keys; ++i)
        std::memcpy(kc + i * dim, kc + (i % k.distinct_keys) * dim, dim * sizeof(float));
      keys.g = gpu().Upload(keys.c);
    }
    Pair out = Zeros(DType::kI32, {n, k.top_k});
    auto paged = Paged(keys.c, 64);  // the GPU reads the keys from a paged pool, the CPU from one block
    cpu_->IndexerTopK(q.c, w.c, ContiguousRows(keys.c), k.num_keys, heads, dim, k.positions.data(), ratio, k.top_k,
                      &out.c);
    gpu().IndexerTopK(q.g, w.g, paged->g, k.num_keys, heads, dim, k.positions.data(), ratio, k.top_k, &out.g);
    ExpectSame(out, std::string("IndexerTopK ") + k.what);
    if (k.num_keys == 5) {
      EXPECT_EQ(out.c.as<int32_t>()[0], -1) << "position 2 sees no key";
    }
    // Keys stored as bf16 and fp8 (--kv-cache-dtype): both backends read the same stored rows. Each row's
    // first value is 1.75, so an fp8 row's scale is 2^-8 and every grid value is an exact e4m3 value:
    // the scores stay exact and the rankings must agree exactly.
    float* kc = keys.c.as<float>();
    for (int64_t i = 0; i < k.num_keys; ++i) kc[i * dim] = 1.75f;
    for (DType storage : {DType::kBF16, DType::kU8}) {
      auto stored = Paged(keys.c, 64, storage);
      Pair sout = Zeros(DType::kI32, {n, k.top_k});
      cpu_->IndexerTopK(q.c, w.c, stored->c, k.num_keys, heads, dim, k.positions.data(), ratio, k.top_k, &sout.c);
      gpu().IndexerTopK(q.g, w.g, stored->g, k.num_keys, heads, dim, k.positions.data(), ratio, k.top_k, &sout.g);
      ExpectSame(sout, std::string("IndexerTopK ") + k.what + " " + DTypeName(storage) + " keys");
    }
  }
}

TEST_F(CudaBackendTest, Attention) {
  DSMESH_REQUIRE_GPU();
  struct Case {
    const char* what;
    int64_t n, start;
    int window;
    int ratio;
    int64_t num_entries;
    int topk_cols;  // 0 = all visible entries
  };
  const int64_t heads = 4, d = 64;
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (const Case& k : {Case{"sliding, from 0", 7, 0, 16, 0, 0, 0}, Case{"sliding, one row", 1, 5, 16, 0, 0, 0},
                        Case{"sliding, ring wraps", 7, 37, 16, 0, 0, 0}, Case{"sliding, ring wraps n=1", 1, 100, 16, 0, 0, 0},
                        Case{"all compressed entries", 7, 37, 16, 4, 11, 0},
                        Case{"all compressed entries, long", 3, 20100, 128, 4, 5025, 0},
                        Case{"topk with -1 and future entries", 7, 37, 16, 4, 12, 8},
                        Case{"topk n=1", 1, 300, 128, 128, 3, 4},
                        Case{"prefill (tensor cores), all entries", 40, 90, 16, 4, 32, 0},
                        Case{"prefill (tensor cores), topk, ring wraps", 37, 203, 16, 4, 60, 8}}) {
    // Steps of more than 16 rows take the tensor-core kernel (PrefillAttentionOnTensorCores).
    const double tol = kF32Tol;
    // Rings of window + 3 slots (speculative rollback) as well as window slots.
    Pair q = Rand({k.n, heads * d}), ring = Rand({k.window + (k.start % 2 ? 3 : 0), d}), new_kv = Rand({k.n, d}), sinks = Rand({heads});
    Pair entries = Rand({std::max<int64_t>(k.num_entries, 1), d});
    // Listed entries run from -1 to past the last visible one, so some are absent and some not yet visible.
    Pair topk = Ints({k.n, std::max(k.topk_cols, 1)}, -1, static_cast<int>(k.num_entries) + 2);
    Pair out = Zeros(DType::kF32, {k.n, heads * d});
    const bool comp = k.ratio > 0;
    const PagedRows flat = ContiguousRows(entries.c);
    auto paged = Paged(entries.c, 16);  // the GPU reads the entries from a paged pool, the CPU from one block
    cpu_->Attention(q.c, heads, d, k.start, ring.c, new_kv.c, k.window, comp ? &flat : nullptr, k.num_entries,
                    k.ratio, k.topk_cols ? &topk.c : nullptr, sinks.c, softmax_scale, &out.c);
    gpu().Attention(q.g, heads, d, k.start, ring.g, new_kv.g, k.window, comp ? &paged->g : nullptr, k.num_entries,
                    k.ratio, k.topk_cols ? &topk.g : nullptr, sinks.g, softmax_scale, &out.g);
    ExpectClose(out, tol, std::string("Attention ") + k.what);
    if (!comp) continue;
    // Entries stored as bf16 and fp8 with 16 rope dims (--kv-cache-dtype), the same stored rows on both.
    for (DType storage : {DType::kBF16, DType::kU8}) {
      auto stored = Paged(entries.c, 16, storage, 16);
      Pair sout = Zeros(DType::kF32, {k.n, heads * d});
      cpu_->Attention(q.c, heads, d, k.start, ring.c, new_kv.c, k.window, &stored->c, k.num_entries, k.ratio,
                      k.topk_cols ? &topk.c : nullptr, sinks.c, softmax_scale, &sout.c);
      gpu().Attention(q.g, heads, d, k.start, ring.g, new_kv.g, k.window, &stored->g, k.num_entries, k.ratio,
                      k.topk_cols ? &topk.g : nullptr, sinks.g, softmax_scale, &sout.g);
      ExpectClose(sout, tol, std::string("Attention ") + k.what + " " + DTypeName(storage) + " entries");
    }
  }
}

// Decode attention (the split kernel) at head dims its register tiles treat differently: the model's 512
// (one channel quad of a key row serves all of a thread's heads), 72 (quads that do not divide the block),
// 30 (zero-padded to whole float4s), with head counts that fill 8-, 3- and 1-head groups, several key
// ranges of several 32-key passes, top-k lists and all visible entries, f32 and fp8 entries.
TEST_F(CudaBackendTest, AttentionHeadDims) {
  DSMESH_REQUIRE_GPU();
  struct Case {
    int64_t heads, d, n, start;
    int topk_cols;
  };
  const int window = 128, ratio = 4;
  for (const Case& k : {Case{8, 512, 1, 4095, 512}, Case{16, 512, 3, 4000, 0}, Case{3, 72, 2, 9000, 0},
                        Case{8, 72, 1, 700, 40}, Case{5, 30, 4, 3000, 0}, Case{1, 30, 1, 100, 9}}) {
    const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(k.d));
    const int64_t num_entries = (k.start + k.n) / ratio;
    Pair q = Rand({k.n, k.heads * k.d}), ring = Rand({window, k.d}), new_kv = Rand({k.n, k.d}), sinks = Rand({k.heads});
    Pair entries = Rand({std::max<int64_t>(num_entries, 1), k.d});
    Pair topk = Ints({k.n, std::max(k.topk_cols, 1)}, -1, static_cast<int>(num_entries) + 2);
    const std::string what = "AttentionHeadDims heads=" + std::to_string(k.heads) + " d=" + std::to_string(k.d) +
                             " topk=" + std::to_string(k.topk_cols);
    for (DType storage : {DType::kF32, DType::kU8}) {
      auto stored = Paged(entries.c, 16, storage, storage == DType::kU8 ? 16 : 0);
      Pair out = Zeros(DType::kF32, {k.n, k.heads * k.d});
      cpu_->Attention(q.c, k.heads, k.d, k.start, ring.c, new_kv.c, window, &stored->c, num_entries, ratio,
                      k.topk_cols ? &topk.c : nullptr, sinks.c, softmax_scale, &out.c);
      gpu().Attention(q.g, k.heads, k.d, k.start, ring.g, new_kv.g, window, &stored->g, num_entries, ratio,
                      k.topk_cols ? &topk.g : nullptr, sinks.g, softmax_scale, &out.g);
      ExpectClose(out, kF32Tol, what + " " + DTypeName(storage));
    }
  }
}

// The indexer at the model's shape (64 heads x 128, top-k 512 of ~1024 keys at 4K context) and at shapes
// its register tiles treat differently (40 heads: a second round of head groups; dim 30: zero-padded),
// with exact scores (grid values) and exact ties (repeated keys) across the k-th largest score.
TEST_F(CudaBackendTest, IndexerTopKModelShapes) {
  DSMESH_REQUIRE_GPU();
  struct Case {
    int64_t heads, dim, num_keys;
    int top_k;
    std::vector<int64_t> positions;
    int distinct_keys;  // 0 = all random
  };
  const int ratio = 4;
  for (const Case& k : {Case{64, 128, 1024, 512, {4095}, 0}, Case{64, 128, 1024, 512, {4095, 4000, 2100}, 300},
                        Case{40, 64, 3000, 100, {12003, 5000}, 0}, Case{8, 30, 700, 64, {2803, 900}, 50}}) {
    const int64_t n = k.positions.size();
    Pair q = Grid({n, k.heads * k.dim}, 4, 0.25f), w = Grid({n, k.heads}, 8, 0.125f);
    Pair keys = Grid({k.num_keys, k.dim}, 4, 0.25f);
    if (k.distinct_keys > 0) {
      float* kc = keys.c.as<float>();
      for (int64_t i = k.distinct_keys; i < k.num_keys; ++i)
        std::memcpy(kc + i * k.dim, kc + (i % k.distinct_keys) * k.dim, k.dim * sizeof(float));
      keys.g = gpu().Upload(keys.c);
    }
    Pair out = Zeros(DType::kI32, {n, k.top_k});
    auto paged = Paged(keys.c, 64);
    cpu_->IndexerTopK(q.c, w.c, ContiguousRows(keys.c), k.num_keys, k.heads, k.dim, k.positions.data(), ratio, k.top_k,
                      &out.c);
    gpu().IndexerTopK(q.g, w.g, paged->g, k.num_keys, k.heads, k.dim, k.positions.data(), ratio, k.top_k, &out.g);
    ExpectSame(out, "IndexerTopKModelShapes heads=" + std::to_string(k.heads) + " dim=" + std::to_string(k.dim) +
                        " ties=" + std::to_string(k.distinct_keys));
  }
}

// Prefill attention (steps of more than 16 rows) on tensor cores against the CPU op, at the model's shapes
// (64 heads x 512, window 128, 4K context: top-k 512 of ratio-4 entries, all ratio-128 entries) and small
// ones (heads that fill part of a 64-head block, or two blocks), entries stored f32, bf16 and fp8, top-k
// lists with -1 padding and not-yet-visible entries. Every path of CudaBackendOptions::prefill_attention
// runs the same cases: the default tensor-core kernel (fp16 high + low operand parts) and the older f32
// kernels (split, per-row) at the f32 tolerance, fp16 operands (mma-fp16) at kPrefillAttnFp16Tol. On the
// tensor cores a step split in two chunks gives every row bitwise the result it has in the whole step (a
// row's sums depend on its own keys only).
TEST_F(CudaBackendTest, PrefillAttentionOnTensorCores) {
  DSMESH_REQUIRE_GPU();
  // A backend made with prefill attention on `path`.
  auto with_path = [](CudaBackendOptions::PrefillAttention path) {
    CudaBackendOptions options;
    options.prefill_attention = path;
    return MakeCudaBackend(0, options);
  };
  using Path = CudaBackendOptions::PrefillAttention;
  struct Mode {
    const char* name;
    std::shared_ptr<Backend> be;
    double tol;
  };
  const std::vector<Mode> modes = {{"mma", with_path(Path::kMma), kF32Tol},
                                   {"mma-fp16", with_path(Path::kMmaFp16), kPrefillAttnFp16Tol},
                                   {"split", with_path(Path::kSplit), kF32Tol},
                                   {"per-row", with_path(Path::kPerRow), kF32Tol}};
  struct Case {
    const char* what;
    int64_t heads, d, n, start;
    int window, ratio, topk_cols;
    DType storage;
    int64_t chunk;  // > 0: also run rows [0, chunk) and [chunk, n) as two steps
  };
  const std::vector<Case> cases = {
      {"small sliding from 0", 4, 64, 24, 0, 16, 0, 0, DType::kF32, 0},
      {"small sliding ring wraps", 4, 64, 100, 237, 16, 0, 0, DType::kF32, 40},
      {"small ratio 4 top-k", 4, 64, 100, 237, 16, 4, 16, DType::kF32, 40},
      {"small ratio 4 top-k bf16", 4, 64, 100, 237, 16, 4, 16, DType::kBF16, 0},
      {"small ratio 4 top-k fp8", 4, 64, 100, 237, 16, 4, 16, DType::kU8, 0},
      {"small ratio 128 all entries", 4, 64, 512, 3584, 16, 128, 0, DType::kF32, 0},
      {"small ratio 128 all entries fp8", 8, 64, 512, 3584, 16, 128, 0, DType::kU8, 200},
      {"72 heads x 128 ratio 4 top-k", 72, 128, 24, 50, 16, 4, 8, DType::kBF16, 0},
      {"full sliding", 64, 512, 100, 1000, 128, 0, 0, DType::kF32, 0},
      {"full ratio 4 top-k 512 from 0", 64, 512, 24, 0, 128, 4, 512, DType::kF32, 0},
      {"full ratio 4 top-k 512", 64, 512, 512, 3584, 128, 4, 512, DType::kF32, 200},
      {"full ratio 4 top-k 512 fp8", 64, 512, 512, 3584, 128, 4, 512, DType::kU8, 0},
      {"full ratio 128 all entries bf16", 64, 512, 512, 3584, 128, 128, 0, DType::kBF16, 0},
  };
  for (const Case& k : cases) {
    std::printf("%s: tensor-core kernel for head_dim %lld on this device: %s, fp16 operands: %s\n", k.what,
                static_cast<long long>(k.d), cuda_ops::AttentionPrefillSupported(k.d, false) ? "yes" : "NO (split path)",
                cuda_ops::AttentionPrefillSupported(k.d, true) ? "yes" : "NO (split path)");
    const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(k.d));
    const int64_t hd = k.heads * k.d, num_entries = k.ratio > 0 ? (k.start + k.n) / k.ratio : 0;
    const int64_t ring_slots = k.window + (k.start % 2 ? 3 : 0);
    Pair q = Rand({k.n, hd}), ring = Rand({ring_slots, k.d}), new_kv = Rand({k.n, k.d}), sinks = Rand({k.heads});
    // Top-k lists of entries -1 .. num_entries + 1 (absent and not yet visible ones included), the last
    // quarter of every other row padded with -1.
    Tensor topk_host = AllocateTensor(DType::kI32, {k.n, std::max(k.topk_cols, 1)});
    std::uniform_int_distribution<int> pick(-1, static_cast<int>(num_entries) + 1);
    for (int64_t r = 0; r < k.n; ++r)
      for (int c = 0; c < k.topk_cols; ++c)
        topk_host.as<int32_t>()[r * k.topk_cols + c] = r % 2 && c >= k.topk_cols * 3 / 4 ? -1 : pick(rng_);
    Pair topk = Both(topk_host);
    const Tensor entry_rows = HostRand(DType::kF32, {std::max<int64_t>(num_entries, 1), k.d});
    auto stored = Paged(entry_rows, 16, k.storage, k.storage == DType::kU8 ? k.d / 8 : 0);
    const bool comp = k.ratio > 0;
    const Tensor* tc = k.topk_cols ? &topk.c : nullptr;
    const Tensor* tg = k.topk_cols ? &topk.g : nullptr;
    Tensor ref = AllocateTensor(DType::kF32, {k.n, hd});
    cpu_->Attention(q.c, k.heads, k.d, k.start, ring.c, new_kv.c, k.window, comp ? &stored->c : nullptr, num_entries,
                    k.ratio, tc, sinks.c, softmax_scale, &ref);
    const std::string what = std::string(k.what) + " (" + std::to_string(k.n) + " rows, " +
                             std::to_string(k.heads) + " heads x " + std::to_string(k.d) + ")";
    for (const Mode& m : modes) {
      Pair out{ref, m.be->Upload(AllocateTensor(DType::kF32, {k.n, hd}))};
      m.be->Attention(q.g, k.heads, k.d, k.start, ring.g, new_kv.g, k.window, comp ? &stored->g : nullptr,
                      num_entries, k.ratio, tg, sinks.g, softmax_scale, &out.g);
      std::vector<float> got(k.n * hd);
      m.be->ToHost(out.g, got.data());  // also waits for the mode's stream
      double num = 0, den = 0;
      for (int64_t i = 0; i < k.n * hd; ++i) {
        const double e = static_cast<double>(got[i]) - ref.as<float>()[i];
        num += e * e;
        den += static_cast<double>(ref.as<float>()[i]) * ref.as<float>()[i];
      }
      std::printf("  %-12s rel L2 vs CPU %.3g\n", m.name, std::sqrt(num / std::max(den, 1e-300)));
      ExpectClose(out, m.tol, what + " " + m.name);
      if (k.chunk <= 0 || std::strncmp(m.name, "mma", 3) != 0) continue;
      // The same rows as two steps: the second one's ring holds the first one's rows.
      Tensor ring2 = AllocateTensor(DType::kF32, ring.c.shape);
      std::memcpy(ring2.data, ring.c.data, ring.c.nbytes());
      cpu_->UpdateRing(RowView(new_kv.c, 0, k.chunk), k.start, k.window, &ring2);
      const Tensor ring2_g = m.be->Upload(ring2);
      Tensor parts = m.be->Upload(AllocateTensor(DType::kF32, {k.n, hd}));
      for (int part = 0; part < 2; ++part) {
        const int64_t r0 = part ? k.chunk : 0, rows = part ? k.n - k.chunk : k.chunk;
        Tensor ov = RowView(parts, r0, rows), tv;
        if (tg) tv = RowView(*tg, r0, rows);
        m.be->Attention(RowView(q.g, r0, rows), k.heads, k.d, k.start + r0, part ? ring2_g : ring.g,
                        RowView(new_kv.g, r0, rows), k.window, comp ? &stored->g : nullptr, num_entries, k.ratio,
                        tg ? &tv : nullptr, sinks.g, softmax_scale, &ov);
      }
      std::vector<float> got_parts(k.n * hd);
      m.be->ToHost(parts, got_parts.data());
      EXPECT_EQ(0, std::memcmp(got.data(), got_parts.data(), got.size() * sizeof(float)))
          << what << ": rows differ between the whole step and chunks of " << k.chunk;
    }
  }
}

// Several sequences in one launch (Backend::AttentionBatch): against the CPU (which runs Attention per
// sequence), and bitwise against the GPU's own per-sequence calls: a row splits its keys by its own key
// count only, so batching changes no sum. Decode (1 row each) and verification (4 rows each) shapes, with
// listed top-k entries and with all entries, f32 and fp8 entries.
TEST_F(CudaBackendTest, AttentionBatchEqualsPerSequence) {
  DSMESH_REQUIRE_GPU();
  const int64_t heads = 8, d = 64;
  const int window = 16, ratio = 4;
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::vector<int64_t> starts = {37, 5, 2000, 611};
  for (int rows : {1, 4})
    for (int topk_cols : {0, 8})
      for (DType storage : {DType::kF32, DType::kU8}) {
        const int64_t n = rows * static_cast<int64_t>(starts.size());
        Pair q = Rand({n, heads * d}), new_kv = Rand({n, d}), sinks = Rand({heads});
        Pair topk = Ints({n, std::max(topk_cols, 1)}, -1, 600);
        std::vector<Pair> rings;
        std::vector<Tensor> entry_rows;
        std::vector<std::unique_ptr<PagedPair>> paged;
        std::vector<Backend::AttentionSeq> cs, gs;
        for (size_t i = 0; i < starts.size(); ++i) {
          const int64_t num_entries = (starts[i] + rows) / ratio;
          rings.push_back(Rand({window + 3, d}));
          entry_rows.push_back(HostRand(DType::kF32, {std::max<int64_t>(num_entries, 1), d}));
          paged.push_back(Paged(entry_rows.back(), 16, storage, storage == DType::kU8 ? 16 : 0));
        }
        for (size_t i = 0; i < starts.size(); ++i) {
          const int64_t num_entries = (starts[i] + rows) / ratio;
          cs.push_back({static_cast<int64_t>(i) * rows, rows, starts[i], &rings[i].c, &paged[i]->c, num_entries});
          gs.push_back({static_cast<int64_t>(i) * rows, rows, starts[i], &rings[i].g, &paged[i]->g, num_entries});
        }
        Pair out = Zeros(DType::kF32, {n, heads * d});
        const Tensor* tc = topk_cols ? &topk.c : nullptr;
        const Tensor* tg = topk_cols ? &topk.g : nullptr;
        cpu_->AttentionBatch(q.c, heads, d, new_kv.c, window, ratio, tc, sinks.c, softmax_scale, cs, &out.c);
        gpu().AttentionBatch(q.g, heads, d, new_kv.g, window, ratio, tg, sinks.g, softmax_scale, gs, &out.g);
        const std::string what = std::string("AttentionBatch rows=") + std::to_string(rows) +
                                 " topk=" + std::to_string(topk_cols) + " " + DTypeName(storage);
        ExpectClose(out, kF32Tol, what);
        // The GPU's per-sequence calls, into a separate output: bitwise the batch's rows.
        Pair alone = Zeros(DType::kF32, {n, heads * d});
        for (const Backend::AttentionSeq& a : gs) {
          Tensor ov = RowView(alone.g, a.offset, a.count), tv;
          if (tg) tv = RowView(*tg, a.offset, a.count);
          gpu().Attention(RowView(q.g, a.offset, a.count), heads, d, a.start, *a.ring, RowView(new_kv.g, a.offset, a.count),
                          window, a.entries, a.num_entries, ratio, tg ? &tv : nullptr, sinks.g, softmax_scale, &ov);
        }
        EXPECT_EQ(GpuBytes(alone.g), GpuBytes(out.g)) << what << ": batched rows differ from the same rows alone";
      }
}

// The indexer for several sequences in one launch (Backend::IndexerTopKBatch): the same top-k lists as the
// CPU (grid values: exact scores) and as the GPU's per-sequence calls.
TEST_F(CudaBackendTest, IndexerTopKBatchEqualsPerSequence) {
  DSMESH_REQUIRE_GPU();
  const int64_t heads = 8, dim = 64;
  const int ratio = 4, top_k = 64;
  const std::vector<int64_t> starts = {4003, 37, 811, 2500};
  for (int rows : {1, 4}) {
    const int64_t n = rows * static_cast<int64_t>(starts.size());
    Pair q = Grid({n, heads * dim}, 4, 0.25f), w = Grid({n, heads}, 8, 0.125f);
    std::vector<int64_t> positions;
    std::vector<Pair> keys;
    std::vector<std::unique_ptr<PagedPair>> paged;
    std::vector<Backend::IndexerSeq> cs, gs;
    for (size_t i = 0; i < starts.size(); ++i) {
      for (int r = 0; r < rows; ++r) positions.push_back(starts[i] + r);
      keys.push_back(Grid({(starts[i] + rows) / ratio, dim}, 4, 0.25f));
      paged.push_back(Paged(keys.back().c, 64));
    }
    for (size_t i = 0; i < starts.size(); ++i) {
      const int64_t num = (starts[i] + rows) / ratio;
      cs.push_back({static_cast<int64_t>(i) * rows, rows, &paged[i]->c, num});
      gs.push_back({static_cast<int64_t>(i) * rows, rows, &paged[i]->g, num});
    }
    Pair out = Zeros(DType::kI32, {n, top_k}), alone = Zeros(DType::kI32, {n, top_k});
    cpu_->IndexerTopKBatch(q.c, w.c, heads, dim, positions.data(), ratio, top_k, cs, &out.c);
    gpu().IndexerTopKBatch(q.g, w.g, heads, dim, positions.data(), ratio, top_k, gs, &out.g);
    ExpectSame(out, "IndexerTopKBatch rows=" + std::to_string(rows));
    for (const Backend::IndexerSeq& a : gs) {
      Tensor ov = RowView(alone.g, a.offset, a.count);
      gpu().IndexerTopK(RowView(q.g, a.offset, a.count), RowView(w.g, a.offset, a.count), *a.keys, a.num_keys, heads,
                        dim, positions.data() + a.offset, ratio, top_k, &ov);
    }
    EXPECT_EQ(GpuBytes(alone.g), GpuBytes(out.g)) << "IndexerTopKBatch rows=" << rows << ": differs from per-sequence calls";
  }
}

// Rows a compressor emits, stored as bf16 and in the fp8 layout on the device: bit for bit the host encoder
// (kernels/kv_rows.h), including an all-zero row, a row of one huge value and values near e4m3 rounding ties.
TEST_F(CudaBackendTest, StoreKvRows) {
  DSMESH_REQUIRE_GPU();
  const int64_t rows = 9, dim = 80, rope = 16;
  Tensor src = HostRand(DType::kF32, {rows, dim}, 3.0f);
  float* x = src.as<float>();
  std::fill(x, x + dim, 0.0f);                                    // row 0: zeros (scale 1)
  x[dim + 5] = 3.0e38f;                                           // row 1: one huge value
  for (int64_t c = 0; c < dim; ++c) x[2 * dim + c] = 0.5f + c * (1.0f / 1024);  // row 2: dense steps
  const Pair s = Both(src);
  for (DType storage : {DType::kBF16, DType::kU8}) {
    const int64_t bytes = KvRowBytes(storage, dim, rope), width = storage == DType::kU8 ? bytes : dim;
    Tensor zeros = AllocateTensor(storage, {rows + 4, width});
    std::memset(zeros.data, 0, zeros.nbytes());
    Pair dst = Both(zeros);
    cpu_->StoreKvRows(s.c, 1, rows - 1, rope, &dst.c, 3);  // rows 1.. of src at 3.. of dst
    gpu().StoreKvRows(s.g, 1, rows - 1, rope, &dst.g, 3);
    cpu_->StoreKvRows(s.c, 0, 1, rope, &dst.c, 0);
    gpu().StoreKvRows(s.g, 0, 1, rope, &dst.g, 0);
    ExpectSame(dst, std::string("StoreKvRows ") + DTypeName(storage));
  }
}

TEST_F(CudaBackendTest, UpdateRing) {
  DSMESH_REQUIRE_GPU();
  for (auto [n, start] : {std::pair<int64_t, int64_t>{5, 13}, {40, 7}, {16, 32}, {1, 0}, {4, 17}}) {
    Pair ring = Rand({start % 2 ? 19 : 16, 32}), new_kv = Rand({n, 32});  // 16 + 3 slots: speculative rollback
    cpu_->UpdateRing(new_kv.c, start, 16, &ring.c);
    gpu().UpdateRing(new_kv.g, start, 16, &ring.g);
    ExpectSame(ring, "UpdateRing n=" + std::to_string(n) + " start=" + std::to_string(start));
  }
}

TEST_F(CudaBackendTest, MoeRoute) {
  DSMESH_REQUIRE_GPU();
  const int64_t n = 9, E = 64, vocab = 100;
  const int k = 6;
  const std::vector<int32_t> tokens = {0, 99, 5, 5, 42, 17, 63, 1, 98};

  // Hash routing, tid2eid as a host tensor (how the loader keeps it) and as a device tensor.
  Tensor tid2eid = AllocateTensor(DType::kI32, {vocab, k});
  std::uniform_int_distribution<int> ed(0, E - 1);
  FillHost(&tid2eid, [&] { return static_cast<float>(ed(rng_)); });
  const Tensor tid2eid_dev = gpu().Upload(tid2eid);
  for (bool on_device : {false, true}) {
    Pair logits = Rand({n, E}, 2.0f), idx = Zeros(DType::kI32, {n, k}), wt = Zeros(DType::kF32, {n, k});
    RouterParams p;
    p.top_k = k;
    p.hash = true;
    p.normalize = true;
    p.routed_scale = 1.5f;
    p.tid2eid = &tid2eid;
    cpu_->MoeRoute(logits.c, tokens.data(), p, &idx.c, &wt.c);
    if (on_device) p.tid2eid = &tid2eid_dev;
    gpu().MoeRoute(logits.g, tokens.data(), p, &idx.g, &wt.g);
    ExpectSame(idx, on_device ? "MoeRoute hash ids (device tid2eid)" : "MoeRoute hash ids");
    ExpectClose(wt, kF32Tol, "MoeRoute hash weights");
  }

  // Biased top-k. Rows are redrawn until the top k+1 biased scores are 1e-4 apart: a few ulps of
  // sqrt/log1p/exp between the backends must not decide the ranking.
  Pair bias = Rand({E}, 0.1f);
  Tensor lh = AllocateTensor(DType::kF32, {n, E});
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int64_t r = 0; r < n; ++r) {
    for (bool ok = false; !ok;) {
      std::vector<double> s(E);
      for (int64_t e = 0; e < E; ++e) {
        lh.as<float>()[r * E + e] = nd(rng_);
        s[e] = std::sqrt(std::log1p(std::exp(static_cast<double>(lh.as<float>()[r * E + e])))) + bias.c.as<float>()[e];
      }
      std::sort(s.rbegin(), s.rend());
      ok = true;
      for (int i = 0; i < k; ++i) ok &= s[i] - s[i + 1] > 1e-4;
    }
  }
  for (bool normalize : {true, false}) {
    Pair logits = Both(lh), idx = Zeros(DType::kI32, {n, k}), wt = Zeros(DType::kF32, {n, k});
    RouterParams p;
    p.top_k = k;
    p.normalize = normalize;
    p.routed_scale = 2.5f;
    p.bias = &bias.c;
    cpu_->MoeRoute(logits.c, tokens.data(), p, &idx.c, &wt.c);
    p.bias = &bias.g;
    gpu().MoeRoute(logits.g, tokens.data(), p, &idx.g, &wt.g);
    ExpectSame(idx, normalize ? "MoeRoute biased ids (normalized)" : "MoeRoute biased ids");
    ExpectClose(wt, kF32Tol, "MoeRoute biased weights");
  }

  // Exact ties (logits from four values, no bias): equal scores go to the lower expert id.
  {
    Tensor th = AllocateTensor(DType::kF32, {n, E});
    std::uniform_int_distribution<int> vd(-1, 2);
    FillHost(&th, [&] { return static_cast<float>(vd(rng_)); });
    Pair logits = Both(th), idx = Zeros(DType::kI32, {n, k}), wt = Zeros(DType::kF32, {n, k});
    RouterParams p;
    p.top_k = k;
    p.routed_scale = 1.0f;
    cpu_->MoeRoute(logits.c, tokens.data(), p, &idx.c, &wt.c);
    gpu().MoeRoute(logits.g, tokens.data(), p, &idx.g, &wt.g);
    ExpectSame(idx, "MoeRoute tied ids");
    ExpectClose(wt, kF32Tol, "MoeRoute tied weights");
  }
}

// Biased top-k at the router's shapes (V4-Flash: 256 experts, top 6, 1 and 16 decode rows) and at the
// edges of the one-warp kernel (fewer experts than lanes, the largest expert count and top-k). Rows are
// redrawn until the top k+1 biased scores are 1e-4 apart, as in MoeRoute.
TEST_F(CudaBackendTest, MoeRouteRouterShapes) {
  DSMESH_REQUIRE_GPU();
  struct Case {
    int64_t n, E;
    int k;
  };
  for (const Case& cs : {Case{1, 256, 6}, Case{16, 256, 6}, Case{3, 20, 6}, Case{2, 4096, 16}}) {
    const int64_t n = cs.n, E = cs.E;
    const int k = cs.k;
    Pair bias = Rand({E}, 0.1f);
    Tensor lh = AllocateTensor(DType::kF32, {n, E});
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (int64_t r = 0; r < n; ++r)
      for (bool ok = false; !ok;) {
        std::vector<double> sc(E);
        for (int64_t e = 0; e < E; ++e) {
          lh.as<float>()[r * E + e] = nd(rng_);
          sc[e] = std::sqrt(std::log1p(std::exp(static_cast<double>(lh.as<float>()[r * E + e])))) +
                  bias.c.as<float>()[e];
        }
        std::sort(sc.rbegin(), sc.rend());
        ok = true;
        for (int i = 0; i < k; ++i) ok &= sc[i] - sc[i + 1] > 1e-4;
      }
    Pair logits = Both(lh), idx = Zeros(DType::kI32, {n, k}), wt = Zeros(DType::kF32, {n, k});
    RouterParams p;
    p.top_k = k;
    p.normalize = true;
    p.routed_scale = 1.5f;
    p.bias = &bias.c;
    const std::vector<int32_t> tokens(n, 0);
    cpu_->MoeRoute(logits.c, tokens.data(), p, &idx.c, &wt.c);
    p.bias = &bias.g;
    gpu().MoeRoute(logits.g, tokens.data(), p, &idx.g, &wt.g);
    const std::string what = "MoeRoute n=" + std::to_string(n) + " E=" + std::to_string(E) + " top-" + std::to_string(k);
    ExpectSame(idx, what + " ids");
    ExpectClose(wt, kF32Tol, what + " weights");
  }
}

TEST_F(CudaBackendTest, DenseExpertsAndSharedExpert) {
  DSMESH_REQUIRE_GPU();
  const int E = 8, k = 3;
  const int64_t D = 128, I = 96;
  const ExpertSet ex = DenseExperts(E, D, I, DType::kBF16);
  for (float limit : {10.0f, 0.0f}) {
    for (int64_t n : {1, 5, 30}) {
      auto [idx, wt] = Routing(n, k, E);
      Pair x = Rand({n, D}), out = Rand({n, D}), before = Copy(out);
      const CudaMoePathCounts c0 = CudaBackendStats(gpu()).moe;
      cpu_->MoeExperts(x.c, idx.c, wt.c, ex.c, limit, &out.c);
      gpu().MoeExperts(x.g, idx.g, wt.g, ex.g, limit, &out.g);
      ExpectClose(out, kF32Tol, "MoeExperts dense n=" + std::to_string(n), &before);
      EXPECT_EQ(CudaBackendStats(gpu()).moe.per_expert_launches, c0.per_expert_launches + 1) << "dense experts run per expert";

      Pair sout = Rand({n, D}), sbefore = Copy(sout);
      cpu_->SharedExpert(x.c, ex.c[2], limit, &sout.c);
      gpu().SharedExpert(x.g, ex.g[2], limit, &sout.g);
      ExpectClose(sout, kF32Tol, "SharedExpert dense n=" + std::to_string(n), &sbefore);
    }
  }
}

TEST_F(CudaBackendTest, Exl3ExpertsMcgFusedAndPerExpert) {
  DSMESH_REQUIRE_GPU();
  const int E = 16, k = 6;
  const int64_t D = 256, I = 256;
  const float limit = 10.0f;
  const ExpertSet ex = Exl3Experts(E, D, I, 2, Exl3Codebook::kMcg);
  // One launch of the routed-expert kernel per call: steps of at most 24 rows as they are, more rows
  // (prefill chunks) as (row, slot) pairs sorted by expert; a chunk of more pairs than the device sort
  // takes (kMoeSortMaxPairs) in parts of rows, one launch each.
  const int64_t part = cuda_ops::kMoeSortMaxPairs / k;
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{24}, int64_t{30}, int64_t{53}, int64_t{300}, part + 7}) {
    auto [idx, wt] = Routing(n, k, E);
    Pair x = Rand({n, D}, 0.5f, true), out = Rand({n, D}), before = Copy(out);
    const CudaMoePathCounts c0 = CudaBackendStats(gpu()).moe;
    cpu_->MoeExperts(x.c, idx.c, wt.c, ex.c, limit, &out.c);
    gpu().MoeExperts(x.g, idx.g, wt.g, ex.g, limit, &out.g);
    ExpectClose(out, kExl3Tol, "MoeExperts EXL3 MCG n=" + std::to_string(n), &before);
    const CudaMoePathCounts c1 = CudaBackendStats(gpu()).moe;
    EXPECT_EQ(c1.fused_launches, c0.fused_launches + (n > part ? 2 : 1)) << "n=" << n;
    EXPECT_EQ(c1.per_expert_launches, c0.per_expert_launches);
  }
  // Every row routed to the same k experts (40 pairs each: three passes of 16 rows over each expert's
  // weights), in rotated slot orders; each row still sums its slots in order.
  {
    const int64_t n = 40;
    Tensor ids = AllocateTensor(DType::kI32, {n, k}), w = AllocateTensor(DType::kF32, {n, k});
    for (int64_t r = 0; r < n; ++r)
      for (int j = 0; j < k; ++j) {
        ids.as<int32_t>()[r * k + j] = static_cast<int32_t>((j + r) % k) * 2;
        w.as<float>()[r * k + j] = 0.1f + 0.05f * j + 0.001f * r;
      }
    const Pair idx = Both(ids), wt = Both(w);
    Pair x = Rand({n, D}, 0.5f, true), out = Rand({n, D}), before = Copy(out);
    cpu_->MoeExperts(x.c, idx.c, wt.c, ex.c, limit, &out.c);
    gpu().MoeExperts(x.g, idx.g, wt.g, ex.g, limit, &out.g);
    ExpectClose(out, kExl3Tol, "MoeExperts EXL3 MCG, 40 rows on the same 6 experts", &before);
  }
  // The shared expert through the EXL3 linears: GEMV (m <= 16) and GEMM (m > 16).
  for (int64_t n : {1, 5, 16, 20}) {
    Pair x = Rand({n, D}, 0.5f, true), out = Rand({n, D}), before = Copy(out);
    cpu_->SharedExpert(x.c, ex.c[0], limit, &out.c);
    gpu().SharedExpert(x.g, ex.g[0], limit, &out.g);
    ExpectClose(out, kExl3Tol, "SharedExpert EXL3 n=" + std::to_string(n), &before);
  }
}

// MoeExpertsInto: out = the routed experts' sum, whatever out held (the MoE block's first term). The fused
// decode kernel writes out itself; the other paths zero it first. Against the CPU's Zero + MoeExperts.
TEST_F(CudaBackendTest, MoeExpertsIntoOverwritesOut) {
  DSMESH_REQUIRE_GPU();
  const int E = 16, k = 6;
  const int64_t D = 256, I = 256;
  const float limit = 10.0f;
  const ExpertSet ex = Exl3Experts(E, D, I, 2, Exl3Codebook::kMcg);
  for (int64_t n : {1, 5, 16, 24, 30, 300}) {
    auto [idx, wt] = Routing(n, k, E);
    Pair x = Rand({n, D}, 0.5f, true), out = Rand({n, D}, 100.0f);
    const CudaMoePathCounts c0 = CudaBackendStats(gpu()).moe;
    cpu_->MoeExpertsInto(x.c, idx.c, wt.c, ex.c, limit, &out.c);
    gpu().MoeExpertsInto(x.g, idx.g, wt.g, ex.g, limit, &out.g);
    ExpectClose(out, kExl3Tol, "MoeExpertsInto EXL3 MCG n=" + std::to_string(n));
    EXPECT_EQ(CudaBackendStats(gpu()).moe.fused_launches, c0.fused_launches + 1) << "n=" << n;
  }
  const ExpertSet dense = DenseExperts(8, 128, 96, DType::kBF16);
  for (int64_t n : {1, 5}) {
    auto [idx, wt] = Routing(n, 3, 8);
    Pair x = Rand({n, 128}), out = Rand({n, 128}, 100.0f);
    cpu_->MoeExpertsInto(x.c, idx.c, wt.c, dense.c, limit, &out.c);
    gpu().MoeExpertsInto(x.g, idx.g, wt.g, dense.g, limit, &out.g);
    ExpectClose(out, kF32Tol, "MoeExpertsInto dense n=" + std::to_string(n));
  }
}

TEST_F(CudaBackendTest, Exl3Experts3InstPerExpert) {
  DSMESH_REQUIRE_GPU();
  const int E = 8, k = 4;
  const int64_t D = 256, I = 256;
  const ExpertSet ex = Exl3Experts(E, D, I, 3, Exl3Codebook::k3Inst);
  for (int64_t n : {1, 7}) {
    auto [idx, wt] = Routing(n, k, E);
    Pair x = Rand({n, D}, 0.5f, true), out = Rand({n, D}), before = Copy(out);
    const CudaMoePathCounts c0 = CudaBackendStats(gpu()).moe;
    cpu_->MoeExperts(x.c, idx.c, wt.c, ex.c, 10.0f, &out.c);
    gpu().MoeExperts(x.g, idx.g, wt.g, ex.g, 10.0f, &out.g);
    ExpectClose(out, kExl3Tol, "MoeExperts EXL3 3INST n=" + std::to_string(n), &before);
    const CudaMoePathCounts c1 = CudaBackendStats(gpu()).moe;
    EXPECT_EQ(c1.per_expert_launches, c0.per_expert_launches + 1) << "3INST experts run per expert";
    EXPECT_EQ(c1.fused_launches, c0.fused_launches);
  }
}

TEST_F(CudaBackendTest, Exl3LinearSlicesAndGrouped) {
  DSMESH_REQUIRE_GPU();
  Exl3Checkpoint w(7);
  w.Add("lin", 256, 384, 4, Exl3Codebook::kMcg, true);
  w.Add("lin3", 256, 256, 3, Exl3Codebook::k3Inst, false);
  w.Add("grp", 256, 384, 3, Exl3Codebook::kMcg, true);
  const Checkpoint ck = w.Write();
  struct Case {
    const char* what;
    const char* prefix;
    int64_t out, in, o0, o1, i0, i1;
  };
  // Every weight is loaded before the first run: the backend sizes its GEMM workspace from what is loaded.
  const std::vector<Case> cases = {
      {"full, bias", "lin", 384, 256, 0, 384, 0, 256},
      {"out slice [128, 256)", "lin", 384, 256, 128, 256, 0, 256},
      {"out slice [100, 300)", "lin", 384, 256, 100, 300, 0, 256},
      {"in slice [128, 256) (no bias)", "lin", 384, 256, 0, 384, 128, 256},
      {"in slice [64, 200), out slice [128, 256)", "lin", 384, 256, 128, 256, 64, 200},
      {"3INST full", "lin3", 256, 256, 0, 256, 0, 256},
  };
  std::vector<LinPair> lins;
  for (const Case& c : cases) lins.push_back(Exl3(ck, c.prefix, c.out, c.in, c.o0, c.o1, c.i0, c.i1));
  const int groups = 4;  // 96 outputs per group: groups straddle the 128-blocks
  const LinPair grp = Exl3(ck, "grp", 384, 256, 0, 384, 0, 256);
  ASSERT_EQ(grp.c.in, 256);

  for (size_t i = 0; i < cases.size(); ++i)
    for (int64_t m : {1, 5, 16, 20}) {
      const LinPair& l = lins[i];
      Pair x = Rand({m, l.c.in}, 1.0f, true), y = Zeros(DType::kF32, {m, l.c.out});
      cpu_->Linear(x.c, l.c, &y.c);
      gpu().Linear(x.g, l.g, &y.g);
      ExpectClose(y, kExl3Tol, std::string("EXL3 Linear ") + cases[i].what + " m=" + std::to_string(m));
    }
  for (int64_t m : {1, 4, 5, 16, 20}) {  // one conversion and a GEMV per group up to 16 rows, per group beyond
    Pair x = Rand({m, groups * grp.c.in}, 1.0f, true), y = Zeros(DType::kF32, {m, grp.c.out});
    cpu_->GroupedLinear(x.c, grp.c, groups, &y.c);
    gpu().GroupedLinear(x.g, grp.g, groups, &y.g);
    ExpectClose(y, kExl3Tol, "EXL3 GroupedLinear m=" + std::to_string(m));
  }
}

TEST_F(CudaBackendTest, ErrorsSurfaceAsExceptions) {
  DSMESH_REQUIRE_GPU();
  Pair table = Rand({10, 8});
  Tensor out = gpu().Alloc(DType::kF32, {2, 8});
  const std::vector<int32_t> bad = {3, 10}, negative = {-1, 0};
  EXPECT_THROW(gpu().Embedding(table.g, bad.data(), 2, &out), std::runtime_error);
  EXPECT_THROW(gpu().Embedding(table.g, negative.data(), 2, &out), std::runtime_error);

  // Limits of the kernels: the launchers refuse rather than run out of shared memory.
  const std::vector<int64_t> pos = {100};
  Pair q = Rand({1, 64}), w = Rand({1, 1}), keys = Rand({10, 64});
  Tensor topk = gpu().Alloc(DType::kI32, {1, 4096});
  EXPECT_THROW(gpu().IndexerTopK(q.g, w.g, ContiguousRows(keys.g), 10, 1, 64, pos.data(), 4, 4096, &topk),
               std::runtime_error);
  Tensor ring = gpu().Alloc(DType::kF32, {50000, 64}), kv = gpu().Alloc(DType::kF32, {1, 64});
  Tensor sinks = gpu().Alloc(DType::kF32, {1}), ao = gpu().Alloc(DType::kF32, {1, 64});
  EXPECT_THROW(gpu().Attention(q.g, 1, 64, 60000, ring, kv, 50000, nullptr, 0, 0, nullptr, sinks, 0.125f, &ao),
               std::runtime_error);
  Pair kvp = Rand({4, 8}), score = Rand({4, 8});
  Tensor pool = gpu().Alloc(DType::kF32, {2, 8});
  EXPECT_THROW(gpu().CompressorPool(kvp.g, score.g, 0, 0, 2, 4, false, 8, &pool), std::runtime_error);

  // An expert id past the layer's experts (the per-expert path reads the routing back and checks it).
  const ExpertSet ex = DenseExperts(2, 16, 16, DType::kBF16);
  Tensor ids = AllocateTensor(DType::kI32, {1, 1}), wts = AllocateTensor(DType::kF32, {1, 1});
  ids.as<int32_t>()[0] = 5;
  wts.as<float>()[0] = 1.0f;
  Pair x = Rand({1, 16});
  Tensor mo = gpu().Alloc(DType::kF32, {1, 16});
  EXPECT_THROW(gpu().MoeExperts(x.g, gpu().Upload(ids), gpu().Upload(wts), ex.g, 0.0f, &mo), std::runtime_error);

  // The backend stays usable after refusing.
  Pair a = Rand({3, 5}), acc = Rand({3, 5});
  cpu_->Add(a.c, &acc.c);
  gpu().Add(a.g, &acc.g);
  ExpectSame(acc, "Add after errors");
}

// ---- sampling: the device row sampler against the CPU backend's (kernels/sampling/row_sampler.h) ----

// Logit rows of the shapes sampling meets: wide normal, peaked (a few far above the rest), exact ties
// (quantized values), masked stretches (-inf), NaNs, and a row with nothing drawable.
std::vector<float> SamplingRow(std::mt19937& rng, int64_t vocab, int kind) {
  std::vector<float> x(vocab);
  std::normal_distribution<float> nd(0.0f, kind == 1 ? 3.0f : 1.0f);
  for (float& v : x) v = nd(rng);
  std::uniform_int_distribution<int64_t> any(0, vocab - 1);
  switch (kind) {
    case 1: for (int i = 0; i < 5; ++i) x[any(rng)] += 15.0f; break;
    case 2: for (float& v : x) v = std::round(v * 2.0f) / 2.0f; break;
    case 3: for (int64_t i = 0; i < vocab; i += 3) x[i] = -std::numeric_limits<float>::infinity(); break;
    case 4: for (int i = 0; i < 3; ++i) x[any(rng)] = std::nanf(""); break;
    case 5: for (float& v : x) v = -std::numeric_limits<float>::infinity(); break;
    case 6: for (float& v : x) v = 0.0f; break;  // every token ties
  }
  return x;
}

RowSampling RandomRowSampling(std::mt19937& rng) {
  RowSampling p;
  std::uniform_int_distribution<int> pick(0, 9);
  const float temps[] = {0.0f, 0.0f, 0.3f, 0.7f, 1.0f, 1.0f, 1.3f, 2.0f, 0.05f, 1e-6f};
  p.temperature = temps[pick(rng)];
  if (pick(rng) < 5) p.top_k = std::uniform_int_distribution<int>(1, 2000)(rng);
  if (pick(rng) < 5) p.top_p = std::uniform_real_distribution<float>(0.02f, 1.0f)(rng);
  if (pick(rng) < 3) p.min_p = std::uniform_real_distribution<float>(0.0f, 0.5f)(rng);
  if (pick(rng) < 5) p.logprobs = std::uniform_int_distribution<int>(0, 20)(rng);
  p.seed = rng();
  p.position = std::uniform_int_distribution<int64_t>(0, 400000)(rng);
  return p;
}

// Tokens exactly (ties included: lower id first on both); logprobs to a float ulp or two (the device
// sums exp in a tree); the top ids exactly.
void ExpectSameSamples(const std::vector<SampledRow>& c, const std::vector<SampledRow>& g,
                       const std::vector<RowSampling>& spec, const std::string& what) {
  ASSERT_EQ(c.size(), g.size()) << what;
  for (size_t r = 0; r < c.size(); ++r) {
    SCOPED_TRACE(what + " row " + std::to_string(r) + " temperature " + std::to_string(spec[r].temperature) +
                 " top_k " + std::to_string(spec[r].top_k) + " top_p " + std::to_string(spec[r].top_p) + " min_p " +
                 std::to_string(spec[r].min_p));
    EXPECT_EQ(g[r].token, c[r].token);
    if (spec[r].logprobs < 0) continue;
    const auto near = [](float a, float b) { return a == b || std::fabs(a - b) <= 2e-7f * std::max(1.0f, std::fabs(b)); };
    EXPECT_TRUE(near(g[r].logprob, c[r].logprob)) << "logprob cuda " << g[r].logprob << " cpu " << c[r].logprob;
    ASSERT_EQ(g[r].top_ids, c[r].top_ids);
    for (size_t i = 0; i < c[r].top_logprobs.size(); ++i)
      EXPECT_TRUE(near(g[r].top_logprobs[i], c[r].top_logprobs[i])) << "top " << i;
  }
}

TEST_F(CudaBackendTest, SampleRowsEqualsCpuOnRandomRowsAndParameters) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(77);
  int drawn = 0;
  for (int64_t vocab : {5, 1000, 4099, 129280}) {
    const int rows = vocab > 100000 ? 56 : 140;
    Tensor host = AllocateTensor(DType::kF32, {rows, vocab});
    std::vector<RowSampling> spec(rows);
    for (int r = 0; r < rows; ++r) {
      const std::vector<float> x = SamplingRow(rng, vocab, r % 7);
      std::copy(x.begin(), x.end(), host.as<float>() + r * vocab);
      spec[r] = RandomRowSampling(rng);
      drawn += spec[r].temperature >= 1e-5f;
    }
    const Pair logits = Both(host);
    const std::vector<SampledRow> c = cpu_->SampleRows(logits.c, spec), g = gpu().SampleRows(logits.g, spec);
    // Rows with NaN logits (kind 4) or none finite (kind 5) have no defined logprobs (NaN on both, their
    // top lists ordered among NaNs or -inf ties): only their tokens are compared.
    std::vector<RowSampling> compared = spec;
    for (int r = 0; r < rows; ++r)
      if (r % 7 == 4 || r % 7 == 5) compared[r].logprobs = -1;
    ExpectSameSamples(c, g, compared, "vocab " + std::to_string(vocab));
  }
  EXPECT_GT(drawn, 200);
}

// ArgmaxRows (greedy picks left on the device) against the CPU's (the Backend default: the host sampler's
// greedy rows) on every kind of row (ties, -inf, NaN, all -inf), and EmbeddingIds fed by them: the rows
// Embedding gives for the same ids as host arrays.
TEST_F(CudaBackendTest, ArgmaxRowsAndEmbeddingIds) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (int64_t vocab : {1, 7, 1000, 32768, 129280}) {
    const int rows = 21;
    Tensor host = AllocateTensor(DType::kF32, {rows, vocab});
    for (int r = 0; r < rows; ++r) {
      const std::vector<float> x = SamplingRow(rng, vocab, r % 7);
      std::copy(x.begin(), x.end(), host.as<float>() + r * vocab);
    }
    const Pair logits = Both(host);
    Pair ids = Zeros(DType::kI32, {rows});
    cpu_->ArgmaxRows(logits.c, &ids.c);
    gpu().ArgmaxRows(logits.g, &ids.g);
    ExpectSame(ids, "ArgmaxRows vocab " + std::to_string(vocab));
    const std::vector<SampledRow> greedy = cpu_->SampleRows(logits.c, std::vector<RowSampling>(rows));
    for (int r = 0; r < rows; ++r) EXPECT_EQ(ids.c.as<int32_t>()[r], greedy[r].token) << "row " << r;

    const Pair table = Both(HostRand(DType::kBF16, {std::max<int64_t>(vocab, 1), 64}));
    Pair by_ids = Zeros(DType::kF32, {rows, 64}), by_host = Zeros(DType::kF32, {rows, 64});
    gpu().EmbeddingIds(table.g, ids.g, &by_ids.g);
    cpu_->Embedding(table.c, ids.c.as<int32_t>(), rows, &by_ids.c);
    ExpectSame(by_ids, "EmbeddingIds vocab " + std::to_string(vocab));
    gpu().Embedding(table.g, ids.c.as<int32_t>(), rows, &by_host.g);
    cpu_->EmbeddingIds(table.c, ids.c, &by_host.c);
    ExpectSame(by_host, "Embedding / CPU EmbeddingIds vocab " + std::to_string(vocab));
  }
}

TEST_F(CudaBackendTest, SampleRowsCutsAtTheirBoundariesAndDrawsAcrossPositions) {
  DSMESH_REQUIRE_GPU();
  // One peaked row of the real vocabulary, every cut alone and together, 64 positions each: the draw
  // lands everywhere in the kept set, including next to the cuts.
  const int64_t vocab = 129280;
  std::mt19937 rng(5);
  std::vector<float> x = SamplingRow(rng, vocab, 1);
  std::vector<RowSampling> spec;
  for (float t : {0.6f, 1.0f, 1.7f})
    for (int k : {0, 1, 2, 40, 1024})
      for (float p : {1.0f, 0.9f, 0.5f})
        for (float m : {0.0f, 0.05f})
          for (int pos = 0; pos < 8; ++pos) {
            RowSampling s;
            s.temperature = t, s.top_k = k, s.top_p = p, s.min_p = m, s.seed = 1234, s.position = pos * 7919;
            spec.push_back(s);
          }
  Tensor host = AllocateTensor(DType::kF32, {static_cast<int64_t>(spec.size()), vocab});
  for (size_t r = 0; r < spec.size(); ++r) std::copy(x.begin(), x.end(), host.as<float>() + r * vocab);
  const Pair logits = Both(host);
  ExpectSameSamples(cpu_->SampleRows(logits.c, spec), gpu().SampleRows(logits.g, spec), spec, "peaked row");
}

// ---- image steps (docs/vision.md): span window attention and bias_vl routing ----

// Rows inside a span [first, last] (step rows) see max(0, min(t - window + 1, IMAGE_START)) .. IMAGE_END,
// the others their causal window (the bounds model/forward.cc gives).
void SpanBounds(int64_t n, int64_t start, int window, const std::vector<std::pair<int64_t, int64_t>>& spans,
                std::vector<int64_t>* from, std::vector<int64_t>* to) {
  from->resize(n);
  to->resize(n);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = start + r;
    (*from)[r] = std::max<int64_t>(0, t - window + 1);
    (*to)[r] = t;
  }
  for (const auto& [first, last] : spans)
    for (int64_t r = first; r <= last; ++r) {
      const int64_t t = start + r;
      (*from)[r] = std::max<int64_t>(0, std::min<int64_t>(t - window + 1, start + first));
      (*to)[r] = start + last;
    }
}

TEST_F(CudaBackendTest, SpanWindowAttention) {
  DSMESH_REQUIRE_GPU();
  struct Case {
    const char* what;
    int64_t n, start;
    int window, ratio;
    int64_t num_entries;
    int topk_cols;  // 0 = all visible entries
    std::vector<std::pair<int64_t, int64_t>> spans;
  };
  const int64_t heads = 4;
  for (int64_t d : {64, 512}) {
    const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (const Case& k : {Case{"sliding, span from 0 longer than the window", 50, 0, 16, 0, 0, 0, {{3, 40}}},
                          Case{"sliding, span reaching into the ring", 30, 37, 16, 0, 0, 0, {{0, 20}}},
                          Case{"sliding, two spans and text rows", 40, 100, 16, 0, 0, 0, {{2, 9}, {15, 33}}},
                          Case{"all compressed entries", 24, 37, 16, 4, 15, 0, {{4, 20}}},
                          Case{"topk with -1 and future entries", 24, 37, 16, 4, 15, 8, {{4, 20}}},
                          Case{"long context, topk", 20, 20100, 128, 4, 5025, 64, {{1, 18}}}}) {
      const std::string what = std::string("SpanWindowAttention d=") + std::to_string(d) + " " + k.what;
      Pair q = Rand({k.n, heads * d}), ring = Rand({k.window + 3, d}), new_kv = Rand({k.n, d}), sinks = Rand({heads});
      Pair entries = Rand({std::max<int64_t>(k.num_entries, 1), d});
      Pair topk = Ints({k.n, std::max(k.topk_cols, 1)}, -1, static_cast<int>(k.num_entries) + 2);
      std::vector<int64_t> from, to;
      SpanBounds(k.n, k.start, k.window, k.spans, &from, &to);
      const bool comp = k.ratio > 0;
      const PagedRows flat = ContiguousRows(entries.c);
      for (DType storage : {DType::kF32, DType::kBF16, DType::kU8}) {
        if (!comp && storage != DType::kF32) continue;
        auto paged = Paged(entries.c, 16, storage, storage == DType::kF32 ? 0 : 16);
        const PagedRows* ce = comp ? (storage == DType::kF32 ? &flat : &paged->c) : nullptr;
        Pair out = Zeros(DType::kF32, {k.n, heads * d});
        cpu_->SpanWindowAttention(q.c, heads, d, k.start, ring.c, new_kv.c, k.window, from.data(), to.data(), ce,
                                  k.num_entries, k.ratio, k.topk_cols ? &topk.c : nullptr, sinks.c, softmax_scale,
                                  &out.c);
        gpu().SpanWindowAttention(q.g, heads, d, k.start, ring.g, new_kv.g, k.window, from.data(), to.data(),
                                  comp ? &paged->g : nullptr, k.num_entries, k.ratio, k.topk_cols ? &topk.g : nullptr,
                                  sinks.g, softmax_scale, &out.g);
        ExpectClose(out, kF32Tol, what + " " + DTypeName(storage) + " entries");
      }
      // Causal bounds give Attention's result (another kernel: to f32 rounding).
      std::vector<int64_t> cfrom, cto;
      SpanBounds(k.n, k.start, k.window, {}, &cfrom, &cto);
      auto paged = Paged(entries.c, 16);
      Pair span_out = Zeros(DType::kF32, {k.n, heads * d}), attn_out = Zeros(DType::kF32, {k.n, heads * d});
      gpu().SpanWindowAttention(q.g, heads, d, k.start, ring.g, new_kv.g, k.window, cfrom.data(), cto.data(),
                                comp ? &paged->g : nullptr, k.num_entries, k.ratio, k.topk_cols ? &topk.g : nullptr,
                                sinks.g, softmax_scale, &span_out.g);
      gpu().Attention(q.g, heads, d, k.start, ring.g, new_kv.g, k.window, comp ? &paged->g : nullptr, k.num_entries,
                      k.ratio, k.topk_cols ? &topk.g : nullptr, sinks.g, softmax_scale, &attn_out.g);
      Pair same{Tensor(), span_out.g};
      const std::vector<uint8_t> ab = GpuBytes(attn_out.g);
      same.c = AllocateTensor(DType::kF32, {k.n, heads * d});
      std::memcpy(same.c.data, ab.data(), ab.size());
      ExpectClose(same, kF32Tol, what + ": causal bounds vs Attention");
    }
  }
  // Bounds past the step or further back than the ring holds are refused, as on the CPU.
  const int64_t d = 64, n = 6, start = 40;
  const int window = 8;
  Pair q = Rand({n, heads * d}), ring = Rand({window, d}), new_kv = Rand({n, d}), sinks = Rand({heads});
  Pair out = Zeros(DType::kF32, {n, heads * d});
  std::vector<int64_t> from, to;
  SpanBounds(n, start, window, {{0, n - 1}}, &from, &to);
  to[n - 1] = start + n;
  EXPECT_THROW(gpu().SpanWindowAttention(q.g, heads, d, start, ring.g, new_kv.g, window, from.data(), to.data(), nullptr,
                                         0, 0, nullptr, sinks.g, 0.1f, &out.g),
               std::runtime_error);
  SpanBounds(n, start, window, {{0, n - 1}}, &from, &to);
  from[0] = start - window;
  EXPECT_THROW(gpu().SpanWindowAttention(q.g, heads, d, start, ring.g, new_kv.g, window, from.data(), to.data(), nullptr,
                                         0, 0, nullptr, sinks.g, 0.1f, &out.g),
               std::runtime_error);
}

// Image rows take top_k(score + bias_vl) on hash and routed layers alike; text rows keep tid2eid or the
// text bias. Logits are redrawn until the top k+1 of the bias that applies to the row are 1e-4 apart, so
// that ulps of sqrt/log1p/exp between the backends cannot decide the ranking.
TEST_F(CudaBackendTest, MoeRouteImageRows) {
  DSMESH_REQUIRE_GPU();
  const int64_t n = 11, E = 64, vocab = 100;
  const int k = 6;
  const std::vector<int32_t> tokens = {0, 99, 5, 5, 42, 17, 63, 1, 98, 7, 8};
  // Two runs of image rows (2..5 and 8..9) and a last image row alone (10).
  const std::vector<uint8_t> image = {0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1};
  Tensor tid2eid = AllocateTensor(DType::kI32, {vocab, k});
  std::uniform_int_distribution<int> ed(0, E - 1);
  FillHost(&tid2eid, [&] { return static_cast<float>(ed(rng_)); });
  Pair bias = Rand({E}, 0.1f), bias_vl = Rand({E}, 0.5f);
  Tensor lh = AllocateTensor(DType::kF32, {n, E});
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (bool hash : {true, false}) {
    for (int64_t r = 0; r < n; ++r) {
      const float* b = image[r] ? bias_vl.c.as<float>() : (hash ? nullptr : bias.c.as<float>());
      for (bool ok = false; !ok;) {
        std::vector<double> s(E);
        for (int64_t e = 0; e < E; ++e) {
          lh.as<float>()[r * E + e] = nd(rng_);
          s[e] = std::sqrt(std::log1p(std::exp(static_cast<double>(lh.as<float>()[r * E + e])))) + (b ? b[e] : 0.0);
        }
        std::sort(s.rbegin(), s.rend());
        ok = true;
        for (int i = 0; i < k && b; ++i) ok &= s[i] - s[i + 1] > 1e-4;
      }
    }
    for (bool normalize : {true, false}) {
      Pair logits = Both(lh), idx = Zeros(DType::kI32, {n, k}), wt = Zeros(DType::kF32, {n, k});
      RouterParams p;
      p.top_k = k;
      p.hash = hash;
      p.normalize = normalize;
      p.routed_scale = 1.5f;
      p.image_rows = image.data();
      p.tid2eid = hash ? &tid2eid : nullptr;
      p.bias = hash ? nullptr : &bias.c;
      p.bias_vl = &bias_vl.c;
      cpu_->MoeRoute(logits.c, tokens.data(), p, &idx.c, &wt.c);
      p.bias = hash ? nullptr : &bias.g;
      p.bias_vl = &bias_vl.g;
      gpu().MoeRoute(logits.g, tokens.data(), p, &idx.g, &wt.g);
      const std::string what = std::string("MoeRoute image rows, ") + (hash ? "hash" : "routed") + " layer" +
                               (normalize ? ", normalized" : "");
      ExpectSame(idx, what + " ids");
      ExpectClose(wt, kF32Tol, what + " weights");
      // The image rows did not take the text choice (the bias_vl route is the one compared above).
      std::vector<int32_t> got(n * k);
      gpu().ToHost(idx.g, got.data());
      for (int64_t r = 0; r < n; ++r) {
        if (!image[r] || !hash) continue;
        EXPECT_FALSE(std::equal(got.begin() + r * k, got.begin() + (r + 1) * k,
                                tid2eid.as<int32_t>() + static_cast<int64_t>(tokens[r]) * k))
            << what << ": image row " << r << " took tid2eid";
      }
    }
  }
  // Image rows without bias_vl are refused.
  Pair logits = Both(lh), idx = Zeros(DType::kI32, {n, k}), wt = Zeros(DType::kF32, {n, k});
  RouterParams p;
  p.top_k = k;
  p.image_rows = image.data();
  EXPECT_THROW(gpu().MoeRoute(logits.g, tokens.data(), p, &idx.g, &wt.g), std::runtime_error);
}

// ---- the vision tower's ops (kernels/cpu/vision_ops.cc) ----

TEST_F(CudaBackendTest, RotateHalf) {
  DSMESH_REQUIRE_GPU();
  for (auto [n, heads, head_dim] : {std::tuple<int64_t, int64_t, int64_t>{7, 4, 16}, {61, 16, 64}, {3, 2, 128}}) {
    Pair x = Rand({n, heads * head_dim});
    // Angles as a ViT's: row and column positions up to 40 times frequencies down to 1e-4.
    Tensor ah = AllocateTensor(DType::kF32, {n, head_dim / 2});
    std::uniform_real_distribution<float> ud(0.0f, 40.0f);
    FillHost(&ah, [&] { return ud(rng_); });
    Pair angles = Both(ah);
    cpu_->RotateHalf(&x.c, heads, head_dim, angles.c);
    gpu().RotateHalf(&x.g, heads, head_dim, angles.g);
    ExpectClose(x, kF32Tol, "RotateHalf head_dim " + std::to_string(head_dim));
  }
  Pair x = Rand({4, 2 * 16}), angles = Rand({3, 8});
  EXPECT_THROW(gpu().RotateHalf(&x.g, 2, 16, angles.g), std::runtime_error);  // angles for 3 rows of 4
}

TEST_F(CudaBackendTest, SpanAttention) {
  DSMESH_REQUIRE_GPU();
  // Spans of 7, 1, 12 and 75 rows (more than one pass of keys and several tiles), an empty one among them.
  const std::vector<int64_t> spans = {0, 7, 8, 8, 20, 95};
  const int64_t n = spans.back(), num_spans = static_cast<int64_t>(spans.size()) - 1;
  for (auto [heads, d] : {std::pair<int64_t, int64_t>{4, 16}, {16, 64}, {2, 128}, {3, 40}}) {
    Pair q = Rand({n, heads * d}), k = Rand({n, heads * d}), v = Rand({n, heads * d});
    Pair out = Zeros(DType::kF32, {n, heads * d});
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    cpu_->SpanAttention(q.c, k.c, v.c, heads, d, spans.data(), num_spans, scale, &out.c);
    gpu().SpanAttention(q.g, k.g, v.g, heads, d, spans.data(), num_spans, scale, &out.g);
    ExpectClose(out, kF32Tol, "SpanAttention heads " + std::to_string(heads) + " d " + std::to_string(d));
    // A one-row span returns its own value.
    std::vector<float> got(out.g.numel());
    gpu().ToHost(out.g, got.data());
    for (int64_t c = 0; c < heads * d; ++c)
      ASSERT_FLOAT_EQ(got[7 * heads * d + c], v.c.as<float>()[7 * heads * d + c]) << "one-row span, column " << c;
  }
  Pair q = Rand({4, 256}), out = Zeros(DType::kF32, {4, 256});
  const std::vector<int64_t> one = {0, 4};
  EXPECT_THROW(gpu().SpanAttention(q.g, q.g, q.g, 1, 256, one.data(), 1, 0.1f, &out.g), std::runtime_error);
  const std::vector<int64_t> short_spans = {0, 3};
  EXPECT_THROW(gpu().SpanAttention(q.g, q.g, q.g, 2, 128, short_spans.data(), 1, 0.1f, &out.g), std::runtime_error);
}

TEST_F(CudaBackendTest, GeluAndUnfold2D) {
  DSMESH_REQUIRE_GPU();
  Pair x = Rand({37, 129}, 3.0f);
  cpu_->Gelu(&x.c);
  gpu().Gelu(&x.g);
  ExpectClose(x, kF32Tol, "Gelu");
  // r 1..3 on grids that r does and does not divide: a pure copy with zeros, identical bytes.
  for (auto [h, w, r] : {std::tuple<int64_t, int64_t, int>{5, 7, 3}, {6, 3, 3}, {2, 4, 3}, {4, 6, 2}, {3, 5, 1}}) {
    const int64_t C = 24, blocks = ((h + r - 1) / r) * ((w + r - 1) / r);
    Pair in = Rand({h * w, C}), out = Zeros(DType::kF32, {blocks, C * r * r});
    gpu().Zero(&out.g);
    cpu_->Unfold2D(in.c, h, w, r, &out.c);
    gpu().Unfold2D(in.g, h, w, r, &out.g);
    ExpectSame(out, "Unfold2D " + std::to_string(h) + "x" + std::to_string(w) + " r " + std::to_string(r));
  }
  Pair in = Rand({10, 4}), out = Zeros(DType::kF32, {4, 36});
  EXPECT_THROW(gpu().Unfold2D(in.g, 3, 4, 3, &out.g), std::runtime_error);  // 10 rows are not a 3x4 grid
}

}  // namespace
}  // namespace dsmesh

#include "kernels/exl3/vector_check.h"

#include <immintrin.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "kernels/exl3/codebook.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/exl3/hadamard.h"
#include "kernels/exl3/trellis.h"

namespace dsmesh {

std::string Exl3VectorCheck::ToLine() const {
  char buf[512];
  if (!note.empty() && count == 0) {
    std::snprintf(buf, sizeof buf, "%-28s FAIL  %s", group.c_str(), note.c_str());
  } else if (exact) {
    std::snprintf(buf, sizeof buf, "%-28s %s  %lld values, %lld differ, max abs error %.3g%s%s", group.c_str(),
                  ok ? "exact" : "FAIL ", static_cast<long long>(count), static_cast<long long>(mismatches),
                  max_abs_err, note.empty() ? "" : "; ", note.c_str());
  } else {
    std::snprintf(buf, sizeof buf, "%-28s %s  %lld values, max abs error %.3g, rel L2 %.3g (tolerance %.1g)%s%s",
                  group.c_str(), ok ? "ok   " : "FAIL ", static_cast<long long>(count), max_abs_err, rel_l2,
                  tolerance, note.empty() ? "" : "; ", note.c_str());
  }
  return buf;
}

namespace {

float HalfBits(uint16_t h) { return _cvtsh_ss(h); }

// Compares fp16 (or int16) bit patterns exactly; max_abs_err over fp16 values when as_half.
void CompareBits(const uint16_t* ours, const uint16_t* ref, int64_t count, bool as_half, Exl3VectorCheck* c) {
  c->exact = true;
  c->count = count;
  for (int64_t i = 0; i < count; ++i) {
    if (ours[i] == ref[i]) continue;
    ++c->mismatches;
    const double d = as_half ? std::fabs(double(HalfBits(ours[i])) - double(HalfBits(ref[i])))
                             : std::fabs(double(int16_t(ours[i])) - double(int16_t(ref[i])));
    c->max_abs_err = std::max(c->max_abs_err, std::isnan(d) ? INFINITY : d);
    if (c->note.empty()) c->note = "first difference at flat index " + std::to_string(i);
  }
  c->ok = c->mismatches == 0;
}

void CompareTolerance(const std::vector<float>& ours, const std::vector<float>& ref, double tol, Exl3VectorCheck* c) {
  c->exact = false;
  c->tolerance = tol;
  c->count = static_cast<int64_t>(ref.size());
  double err2 = 0, ref2 = 0;
  bool finite = true;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(ours[i]) - double(ref[i]);
    if (!std::isfinite(d)) finite = false;
    err2 += d * d;
    ref2 += double(ref[i]) * ref[i];
    c->max_abs_err = std::max(c->max_abs_err, std::fabs(d));
  }
  c->rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  c->ok = finite && c->rel_l2 <= tol;
  if (!finite) c->note = "non-finite values";
}

void ExpectShape(const Tensor& t, const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  if (t.dtype != dtype || t.shape != shape) {
    std::ostringstream s;
    s << "tensor " << name << " has " << DTypeName(t.dtype) << " " << t.ShapeString() << ", expected "
      << DTypeName(dtype) << " [";
    for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
    s << "]";
    throw std::runtime_error(s.str());
  }
}

// Exl3Weight over a bare trellis (reconstruct vectors carry no suh/svh/markers).
Exl3Weight BareWeight(const Tensor& trellis, const std::string& name, Exl3Codebook cb) {
  if (trellis.dtype != DType::kI16 || trellis.shape.size() != 3 || trellis.shape[2] % 16 != 0)
    throw std::runtime_error("tensor " + name + " is not an int16 [a, b, 16K] trellis: " + trellis.ShapeString());
  Exl3Weight w;
  w.name = name;
  w.trellis = trellis;
  w.K = static_cast<int>(trellis.shape[2] / 16);
  if (w.K < 1 || w.K > 8) throw std::runtime_error("tensor " + name + ": K out of range 1..8");
  w.codebook = cb;
  w.in_features = w.k_padded();
  w.out_features = w.n_padded();
  return w;
}

Exl3VectorCheck Run(const std::string& group, const std::function<void(Exl3VectorCheck*)>& fn) {
  Exl3VectorCheck c;
  c.group = group;
  try {
    fn(&c);
  } catch (const std::exception& e) {
    c.ok = false;
    c.count = 0;
    c.note = e.what();
  }
  return c;
}

}  // namespace

std::vector<Exl3VectorCheck> CheckExl3Vectors(const SafetensorsFile& file) {
  std::vector<Exl3VectorCheck> out;
  std::set<std::string> used;  // names consumed as inputs or checked
  const std::regex codebook_re(R"(codebook\.(3inst|mcg|mul1))");
  const std::regex states_re(R"((K(\d)\.(\d+)x(\d+))\.states)");
  const std::regex what_re(R"((K(\d)\.(\d+)x(\d+))\.(3inst|mcg|mul1)\.what)");
  const std::regex w_re(R"((K(\d)\.(\d+)x(\d+)\.(3inst|mcg|mul1))\.w)");
  const std::regex y_re(R"((K(\d)\.(\d+)x(\d+)\.(3inst|mcg|mul1))\.y(\d+))");
  auto get = [&](const std::string& name) {
    if (!file.Has(name)) throw std::runtime_error("missing tensor " + name);
    used.insert(name);
    return file.Get(name);
  };

  for (const std::string& name : file.names()) {
    std::smatch mt;
    if (std::regex_match(name, mt, codebook_re)) {
      out.push_back(Run(name, [&](Exl3VectorCheck* c) {
        const Tensor t = get(name);
        ExpectShape(t, name, DType::kF16, {65536});
        CompareBits(Exl3CodebookTableFp16(ParseExl3Codebook(mt[1])), t.as<uint16_t>(), 65536, true, c);
      }));
    } else if (std::regex_match(name, mt, states_re)) {
      out.push_back(Run(name, [&](Exl3VectorCheck* c) {
        const Tensor states = get(name), trellis = get(mt[1].str() + ".trellis");
        const int K = std::stoi(mt[2]);
        const int64_t a = std::stoll(mt[3]) / 16, b = std::stoll(mt[4]) / 16;
        ExpectShape(trellis, mt[1].str() + ".trellis", DType::kI16, {a, b, 16 * K});
        ExpectShape(states, name, DType::kI16, {a, b, 256});
        std::vector<uint16_t> ours(static_cast<size_t>(a * b * 256));
        const uint16_t* tr = trellis.as<uint16_t>();
        for (int64_t t = 0; t < a * b; ++t) Exl3UnpackTileStates(tr + t * 16 * K, K, &ours[t * 256]);
        CompareBits(ours.data(), states.as<uint16_t>(), a * b * 256, false, c);
        // Round trip: packing the reference states must give back the reference trellis.
        std::vector<uint16_t> packed(static_cast<size_t>(a * b * 16 * K));
        int64_t bad_tiles = 0;
        for (int64_t t = 0; t < a * b; ++t) {
          Exl3PackTileStates(states.as<uint16_t>() + t * 256, K, &packed[t * 16 * K]);
          if (!std::equal(packed.begin() + t * 16 * K, packed.begin() + (t + 1) * 16 * K, tr + t * 16 * K)) ++bad_tiles;
        }
        if (bad_tiles) {
          c->ok = false;
          c->note += (c->note.empty() ? "" : "; ") + std::to_string(bad_tiles) + " tiles do not re-pack to the trellis";
        }
      }));
    } else if (std::regex_match(name, mt, what_re)) {
      out.push_back(Run(name, [&](Exl3VectorCheck* c) {
        const Tensor what = get(name), trellis = get(mt[1].str() + ".trellis");
        const int64_t k = std::stoll(mt[3]), n = std::stoll(mt[4]);
        ExpectShape(what, name, DType::kF16, {k, n});
        const Exl3Weight w = BareWeight(trellis, mt[1].str() + ".trellis", ParseExl3Codebook(mt[5]));
        if (w.K != std::stoi(mt[2]) || w.k_padded() != k || w.n_padded() != n)
          throw std::runtime_error("trellis shape " + trellis.ShapeString() + " does not match the name " + name);
        const std::vector<uint16_t> ours = Exl3ReconstructFp16(w);  // fast AVX2 path
        CompareBits(ours.data(), what.as<uint16_t>(), k * n, true, c);
        // The scalar per-tile reference must agree too (it is what kernels/cuda tests against).
        uint16_t tile[256];
        int64_t bad = 0;
        const int64_t tiles_n = n / 16;
        for (int64_t t = 0; t < (k / 16) * tiles_n; ++t) {
          Exl3DecodeTileFp16(trellis.as<uint16_t>() + t * 16 * w.K, w.K, w.codebook, tile);
          for (int r = 0; r < 16; ++r)
            for (int cc = 0; cc < 16; ++cc)
              if (tile[16 * r + cc] != what.as<uint16_t>()[(16 * (t / tiles_n) + r) * n + 16 * (t % tiles_n) + cc]) ++bad;
        }
        if (bad) {
          c->ok = false;
          c->note += (c->note.empty() ? "" : "; ") + std::string("scalar reference differs in ") + std::to_string(bad) + " values";
        }
      }));
    } else if (std::regex_match(name, mt, w_re)) {
      out.push_back(Run(name, [&](Exl3VectorCheck* c) {
        const std::string prefix = mt[1];
        const Tensor ref = get(name);
        for (const char* part : {".trellis", ".suh", ".svh"}) get(prefix + part);
        Exl3Weight w = LoadExl3Weight(LookupIn(file), prefix);
        w.codebook = ParseExl3Codebook(mt[5]);  // linear vectors name the codebook instead of a marker
        ExpectShape(ref, name, DType::kF16, {w.k_padded(), w.n_padded()});
        const std::vector<float> ours = Exl3OriginalWeightF32(w);
        std::vector<float> reff(ours.size());
        for (size_t i = 0; i < reff.size(); ++i) reff[i] = HalfBits(ref.as<uint16_t>()[i]);
        CompareTolerance(ours, reff, kExl3WeightRelTolerance, c);
      }));
    } else if (std::regex_match(name, mt, y_re)) {
      out.push_back(Run(name, [&](Exl3VectorCheck* c) {
        const std::string prefix = mt[1];
        const int64_t m = std::stoll(mt[6]);
        const Tensor ref = get(name), x = get(prefix + ".x" + mt[6].str());
        for (const char* part : {".trellis", ".suh", ".svh"}) get(prefix + part);
        Exl3Weight w = LoadExl3Weight(LookupIn(file), prefix);
        w.codebook = ParseExl3Codebook(mt[5]);
        ExpectShape(x, prefix + ".x" + mt[6].str(), DType::kF16, {m, w.k_padded()});
        ExpectShape(ref, name, DType::kF32, {m, w.n_padded()});
        std::vector<float> xf(static_cast<size_t>(m * w.k_padded())), ours(static_cast<size_t>(m * w.n_padded()));
        for (size_t i = 0; i < xf.size(); ++i) xf[i] = HalfBits(x.as<uint16_t>()[i]);
        Exl3LinearCpu(w, xf.data(), m, ours.data());
        const float* r = ref.as<float>();
        CompareTolerance(ours, std::vector<float>(r, r + m * w.n_padded()), kExl3LinearRelTolerance, c);
      }));
    } else if (name == "had.y") {
      out.push_back(Run("had", [&](Exl3VectorCheck* c) {
        const Tensor x = get("had.x"), y = get("had.y");
        if (x.dtype != DType::kF16 || x.shape.size() != 2 || x.shape[1] % 128 != 0)
          throw std::runtime_error("had.x must be F16 [rows, 128 b], is " + x.ShapeString());
        ExpectShape(y, "had.y", DType::kF16, x.shape);
        std::vector<uint16_t> ours(static_cast<size_t>(x.numel()));
        // The vectors were made with scale = 1/sqrt(128) (see the spec's note on had.y).
        HadamardR128Fp16(x.as<uint16_t>(), ours.data(), x.shape[0], x.shape[1], static_cast<float>(1.0 / std::sqrt(128.0)));
        CompareBits(ours.data(), y.as<uint16_t>(), x.numel(), true, c);
      }));
    }
  }
  for (const std::string& name : file.names()) {
    if (used.count(name)) continue;
    Exl3VectorCheck c;
    c.group = name;
    c.note = "tensor not consumed by any check (unknown name or missing partner) in " + file.path();
    out.push_back(c);
  }
  return out;
}

}  // namespace dsmesh

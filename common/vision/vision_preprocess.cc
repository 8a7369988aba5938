#include "common/vision/vision_preprocess.h"

#include <cmath>
#include <stdexcept>

#include "common/half.h"

namespace dsmesh {
namespace {

// Python's round() of a float: to nearest, ties to even (the default floating-point rounding mode).
int64_t PyRound(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// grid_tokens: the aligner grid of a best_height x best_width image and its block length (N-layout, with
// the row and pair padding, without the alignment pad).
struct GridTokens {
  int llm_h, llm_w, tokens;
};
GridTokens GridTokensFor(int64_t best_height, int64_t best_width, int p, int r) {
  const int llm_h = static_cast<int>(std::ceil(static_cast<double>(best_height / p) / r));
  const int llm_w = static_cast<int>(std::ceil(static_cast<double>(best_width / p) / r));
  int tokens = llm_h * (llm_w + 1) + 2;
  if (llm_h % 2 == 1) tokens += llm_w + 1;
  tokens += (llm_h + 1) / 2 * (llm_w + 1) % 2 * 2;
  return {llm_h, llm_w, tokens};
}

struct Resized {
  int64_t best_height, best_width;
  GridTokens grid;
};

// solve_resize_ratio: the largest patch-aligned size of the image's aspect ratio whose block fits
// `max_n_token`.
Resized SolveResizeRatio(double height, double width, int p, int r, int max_n_token) {
  const double ratio = height / width;
  const double max_w_float = std::sqrt((max_n_token - 2) / ratio + 0.25) - 0.5;
  const double max_h_float = max_w_float * ratio;
  int64_t best_width, best_height;
  if (max_w_float < 1.0) {
    const int64_t max_w = 1;
    int64_t max_h = (max_n_token - 2) / (max_w + 1);
    if (max_h % 2 == 1) max_h -= 1;
    best_width = max_w * p * r;
    best_height = max_h * p * r;
  } else if (max_h_float < 2.0) {
    const int64_t max_h = 2;
    const int64_t max_w = (max_n_token - 2) / max_h - 1;
    if (max_w <= 1) throw std::runtime_error("image aspect ratio cannot be fitted into the vision token budget");
    best_width = max_w * p * r;
    best_height = max_h * p * r;
  } else {
    const int64_t max_w = static_cast<int64_t>(std::floor(max_w_float));
    int64_t max_h = static_cast<int64_t>(std::floor(max_h_float));
    if (max_h % 2 == 1) max_h -= 1;
    const double beta = std::min(static_cast<double>(max_w * p * r) / width, static_cast<double>(max_h * p * r) / height);
    best_width = static_cast<int64_t>(std::floor(width * beta / p)) * p;
    best_height = static_cast<int64_t>(std::floor(height * beta / p)) * p;
  }
  return {best_height, best_width, GridTokensFor(best_height, best_width, p, r)};
}

// ---- Pillow's bicubic resampling (Resample.c: precompute_coeffs, normalize_coeffs_8bpc, the horizontal
// then vertical 8-bit passes), re-implemented from its description. ------------------------------------

constexpr int kPrecisionBits = 32 - 8 - 2;

double BicubicFilter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Coefficients {
  int ksize = 0;
  std::vector<int> bounds;  // per output: first input index, count
  std::vector<int32_t> k;   // per output: ksize fixed-point weights
};

Coefficients Precompute(int in_size, int out_size) {
  constexpr double kSupport = 2.0;  // bicubic
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = kSupport * filterscale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(2 * out_size);
  c.k.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> w(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = BicubicFilter((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[x] / ww : w[x];
      c.k[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits) : 0.5 + v * (1 << kPrecisionBits));
    }
    c.bounds[2 * xx] = xmin;
    c.bounds[2 * xx + 1] = xmax;
  }
  return c;
}

inline uint8_t Clip8(int32_t v) {
  v >>= kPrecisionBits;  // arithmetic shift: floor
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

RgbImage ResampleHorizontal(const RgbImage& in, int out_w) {
  const Coefficients c = Precompute(in.width, out_w);
  RgbImage out;
  out.width = out_w;
  out.height = in.height;
  out.pixels.resize(static_cast<size_t>(out_w) * in.height * 3);
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* row = in.pixels.data() + static_cast<size_t>(y) * in.width * 3;
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(y) * out_w * 3;
    for (int xx = 0; xx < out_w; ++xx) {
      const int xmin = c.bounds[2 * xx], xmax = c.bounds[2 * xx + 1];
      const int32_t* k = c.k.data() + static_cast<size_t>(xx) * c.ksize;
      int32_t s[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
      for (int x = 0; x < xmax; ++x)
        for (int ch = 0; ch < 3; ++ch) s[ch] += row[(x + xmin) * 3 + ch] * k[x];
      for (int ch = 0; ch < 3; ++ch) dst[xx * 3 + ch] = Clip8(s[ch]);
    }
  }
  return out;
}

RgbImage ResampleVertical(const RgbImage& in, int out_h) {
  const Coefficients c = Precompute(in.height, out_h);
  RgbImage out;
  out.width = in.width;
  out.height = out_h;
  out.pixels.resize(static_cast<size_t>(in.width) * out_h * 3);
  const size_t stride = static_cast<size_t>(in.width) * 3;
  for (int yy = 0; yy < out_h; ++yy) {
    const int ymin = c.bounds[2 * yy], ymax = c.bounds[2 * yy + 1];
    const int32_t* k = c.k.data() + static_cast<size_t>(yy) * c.ksize;
    uint8_t* dst = out.pixels.data() + yy * stride;
    for (size_t i = 0; i < stride; ++i) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < ymax; ++y) s += in.pixels[(ymin + y) * stride + i] * k[y];
      dst[i] = Clip8(s);
    }
  }
  return out;
}

}  // namespace

ImageGrid PlanImageGrid(int image_width, int image_height, const VisionConfig& config) {
  if (image_width <= 0 || image_height <= 0) throw std::runtime_error("image has a zero side");
  const int p = config.patch_size, r = config.downsample_ratio;
  double width = image_width, height = image_height;
  if (config.max_wh_ratio && width > height * *config.max_wh_ratio) width = height * *config.max_wh_ratio;
  if (0 < width * height && width * height < static_cast<double>(config.min_pixels)) {
    const double ratio = std::pow(static_cast<double>(config.min_pixels) / (width * height), 0.5);
    width = static_cast<double>(static_cast<int64_t>(width * ratio));
    height = static_cast<double>(static_cast<int64_t>(height * ratio));
  }
  int64_t best_width = static_cast<int64_t>(std::ceil(width / p)) * p;
  int64_t best_height = static_cast<int64_t>(std::ceil(height / p)) * p;
  // safe_resize: shrink with a decreasing budget until the block fits max_n_token - 3.
  const int max_n_token = config.max_n_token - (kCompressPadTo - 1);
  GridTokens grid = GridTokensFor(best_height, best_width, p, r);
  for (int budget = max_n_token; grid.tokens > max_n_token; --budget) {
    if (budget < 4) throw std::runtime_error("image cannot be fitted into the vision token budget");
    Resized s = SolveResizeRatio(height, width, p, r, budget);
    best_height = s.best_height;
    best_width = s.best_width;
    grid = s.grid;
  }
  if (best_width <= 0 || best_height <= 0) throw std::runtime_error("image cannot be fitted into the vision token budget");
  ImageGrid out;
  out.best_width = static_cast<int>(best_width);
  out.best_height = static_cast<int>(best_height);
  out.vit_h = static_cast<int>(best_height / p);
  out.vit_w = static_cast<int>(best_width / p);
  out.llm_h = grid.llm_h;
  out.llm_w = grid.llm_w;
  out.block_tokens = grid.tokens;
  return out;
}

RgbImage ResizeBicubic(const RgbImage& in, int width, int height) {
  if (width <= 0 || height <= 0) throw ImageError("the image cannot be resized to " + std::to_string(width) + " x " +
                                                  std::to_string(height) + " (aspect ratio too extreme)");
  if (width == in.width && height == in.height) return in;  // Pillow returns a copy
  RgbImage tmp = width != in.width ? ResampleHorizontal(in, width) : in;
  return height != in.height ? ResampleVertical(tmp, height) : tmp;
}

PreprocessedImage PreprocessImage(const RgbImage& image, const VisionConfig& config) {
  PreprocessedImage out;
  ImageGrid& g = out.grid;
  try {
    g = PlanImageGrid(image.width, image.height, config);
  } catch (const std::runtime_error& e) {
    throw ImageError(e.what());
  }
  const int bw = g.best_width, bh = g.best_height;
  RgbImage canvas;
  if (config.max_wh_ratio && image.width >= *config.max_wh_ratio * image.height) {
    canvas = ResizeBicubic(image, bw, bh);  // Image.resize: stretched to the exact size
  } else {
    // ImageOps.pad: ImageOps.contain (fit keeping the aspect ratio), then centred on grey.
    const double im_ratio = static_cast<double>(image.width) / image.height;
    const double dest_ratio = static_cast<double>(bw) / bh;
    int64_t w = bw, h = bh;
    if (im_ratio != dest_ratio) {
      if (im_ratio > dest_ratio) {
        h = PyRound(static_cast<double>(image.height) / image.width * bw);
      } else {
        w = PyRound(static_cast<double>(image.width) / image.height * bh);
      }
    }
    RgbImage resized = ResizeBicubic(image, static_cast<int>(w), static_cast<int>(h));
    if (w == bw && h == bh) {
      canvas = std::move(resized);
    } else {
      canvas.width = bw;
      canvas.height = bh;
      canvas.pixels.assign(static_cast<size_t>(bw) * bh * 3, 127);
      int x0 = 0, y0 = 0;
      if (resized.width != bw) x0 = static_cast<int>(PyRound((bw - resized.width) * 0.5));
      else y0 = static_cast<int>(PyRound((bh - resized.height) * 0.5));
      for (int y = 0; y < resized.height; ++y)
        std::copy_n(resized.at(0, y), static_cast<size_t>(resized.width) * 3, canvas.pixels.data() +
                                                                                 ((static_cast<size_t>(y0) + y) * bw + x0) * 3);
    }
  }
  // (v / 255 - 0.5) / 0.5 in float32, rounded to bf16; patches [vit_h * vit_w, 3, p, p].
  float value[256];
  for (int v = 0; v < 256; ++v) value[v] = Bf16ToFloat(FloatToBf16((static_cast<float>(v) / 255.0f - 0.5f) / 0.5f));
  const int p = config.patch_size;
  out.patches.resize(static_cast<size_t>(g.vit_h) * g.vit_w * 3 * p * p);
  float* dst = out.patches.data();
  for (int i = 0; i < g.vit_h; ++i)
    for (int j = 0; j < g.vit_w; ++j)
      for (int c = 0; c < 3; ++c)
        for (int y = 0; y < p; ++y)
          for (int x = 0; x < p; ++x) *dst++ = value[canvas.at(j * p + x, i * p + y)[c]];
  return out;
}

ImageBlock BuildImageBlock(int llm_h, int llm_w, int64_t start) {
  const int compress_pad = kCompressPadTo - 1 - static_cast<int>(start % kCompressPadTo);
  const int pad_h = llm_h % 2;
  const int rows = llm_h + pad_h;
  const int row_len = llm_w + 1;
  const int pad_last = rows / 2 * row_len % 2 * 2;
  // The grid row-major: llm_w images then a newline per row, an odd row count padded with a row of pads.
  auto grid_type = [&](int row, int col) {
    if (row >= llm_h) return static_cast<int>(kImagePad);
    return col < llm_w ? static_cast<int>(kImageToken) : static_cast<int>(kImageNewline);
  };
  ImageBlock b;
  b.types.assign(compress_pad, kImagePad);
  b.types.push_back(kImageStart);
  // Read two rows at a time, column by column: (2q, c), (2q + 1, c), (2q, c + 1), ...
  for (int q = 0; q < rows / 2; ++q)
    for (int c = 0; c < row_len; ++c)
      for (int k = 0; k < 2; ++k) {
        const int row = 2 * q + k;
        b.types.push_back(grid_type(row, c));
        if (row < llm_h && c < llm_w) b.perm.push_back(row * llm_w + c);
      }
  b.types.insert(b.types.end(), pad_last, kImagePad);
  b.types.push_back(kImageEnd);
  return b;
}

}  // namespace dsmesh

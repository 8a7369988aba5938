#include "model/image_rows.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/vision/vision_preprocess.h"

namespace dsmesh {

StepImageRows BuildStepImageRows(const ExpandedPrompt& prompt, const Tensor& aligner, const VisionWeights& vision,
                                 int64_t from, int64_t to) {
  if (from < 0 || to < from || to > static_cast<int64_t>(prompt.tokens.size()))
    throw std::runtime_error("image rows: step [" + std::to_string(from) + ", " + std::to_string(to) +
                             ") is outside the prompt of " + std::to_string(prompt.tokens.size()) + " tokens");
  const int64_t D = vision.image_start.numel();
  int64_t total = 0;
  for (const ImageSpan& im : prompt.images) total += static_cast<int64_t>(im.perm.size());
  if (aligner.dtype != DType::kF32 || aligner.shape.size() != 2 || aligner.shape[0] != total || aligner.shape[1] != D)
    throw std::runtime_error("image rows: aligner output " + aligner.ShapeString() + " does not match " +
                             std::to_string(prompt.images.size()) + " images of " + std::to_string(total) +
                             " rows of width " + std::to_string(D));
  StepImageRows out;
  std::vector<const float*> sources;  // one per row
  int64_t first_aligner_row = 0;
  for (const ImageSpan& im : prompt.images) {
    const int64_t begin = im.begin, end = im.begin + im.length;
    const int64_t rows_before = first_aligner_row;
    first_aligner_row += static_cast<int64_t>(im.perm.size());
    if (end <= from || begin >= to) continue;
    int64_t start_pos = -1, end_pos = -1;
    size_t slot = 0;  // the next IMAGE slot of this block
    for (int64_t p = begin; p < end; ++p) {
      const int type = prompt.tokens[p] - kImageSentinelBaseId;
      const float* src = nullptr;
      switch (type) {
        case kImageStart: src = vision.image_start.as<float>(); start_pos = p; break;
        case kImagePad: src = vision.image_pad.as<float>(); break;
        case kImageNewline: src = vision.image_newline.as<float>(); break;
        case kImageEnd: src = vision.image_end.as<float>(); end_pos = p; break;
        case kImageToken:
          src = aligner.as<float>() + (rows_before + im.perm.at(slot++)) * D;
          break;
        default:
          throw std::runtime_error("image rows: prompt position " + std::to_string(p) + " inside an image block holds "
                                   "token " + std::to_string(prompt.tokens[p]) + ", not an image sentinel");
      }
      if (p < from || p >= to) continue;
      out.rows.push_back(p - from);
      sources.push_back(src);
    }
    if (start_pos < 0 || end_pos < start_pos)
      throw std::runtime_error("image rows: the block at " + std::to_string(begin) + " has no IMAGE_START .. IMAGE_END");
    if (start_pos < from || end_pos >= to)
      throw std::runtime_error("image rows: step [" + std::to_string(from) + ", " + std::to_string(to) +
                               ") cuts the image span [" + std::to_string(start_pos) + ", " + std::to_string(end_pos) +
                               "]; an image is prefilled in one step");
    out.spans.push_back({start_pos - from, end_pos - from});
  }
  out.embeddings = AllocateTensor(DType::kF32, {static_cast<int64_t>(out.rows.size()), D});
  for (size_t i = 0; i < sources.size(); ++i)
    std::memcpy(out.embeddings.as<float>() + static_cast<int64_t>(i) * D, sources[i], D * sizeof(float));
  return out;
}

int64_t ImageSafeChunkEnd(const ExpandedPrompt& prompt, int64_t want) {
  for (const ImageSpan& im : prompt.images)
    if (want > im.begin && want < im.begin + im.length) return im.begin;
  return want;
}

}  // namespace dsmesh

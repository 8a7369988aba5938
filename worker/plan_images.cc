#include "worker/plan_images.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "model/image_rows.h"
#include "model/model_impl.h"
#include "model/vision_tower.h"

namespace dsmesh {

StepImageRows ImageRowsForChunk(Model& model, const SequencePlan& plan) {
  if (plan.images_size() == 0) return {};
  const ModelConfig& config = model.config();
  if (!config.vision.enabled())
    throw std::runtime_error("plan: sequence " + std::to_string(plan.seq_id()) + " has images but the model has no vision tower");
  const int64_t p = config.vision.patch_size, width = 3 * p * p, n = plan.tokens_size();
  ExpandedPrompt chunk;  // the chunk's tokens, image blocks at chunk-relative positions
  chunk.tokens.assign(plan.tokens().begin(), plan.tokens().end());
  std::vector<VitGrid> grids;
  int64_t patch_rows = 0;
  for (const PromptImage& im : plan.images()) {
    const int64_t rows = static_cast<int64_t>(im.vit_h()) * im.vit_w();
    if (im.vit_h() <= 0 || im.vit_w() <= 0 || im.patches().size() != static_cast<size_t>(rows * width) * sizeof(float))
      throw std::runtime_error("plan: an image's patches (" + std::to_string(im.patches().size()) + " bytes) do not match "
                               "its " + std::to_string(im.vit_h()) + "x" + std::to_string(im.vit_w()) + " grid");
    ImageSpan span;
    span.begin = im.begin() - plan.start_pos();
    span.length = im.length();
    if (span.begin < 0 || span.begin + span.length > n)
      throw std::runtime_error("plan: an image block lies outside its chunk");
    span.perm.assign(im.perm().begin(), im.perm().end());
    chunk.images.push_back(std::move(span));
    grids.push_back({im.vit_h(), im.vit_w()});
    patch_rows += rows;
  }
  Backend& be = model.impl().backend();
  std::vector<float> host(static_cast<size_t>(patch_rows * width));
  size_t at = 0;
  for (const PromptImage& im : plan.images()) {
    std::memcpy(host.data() + at, im.patches().data(), im.patches().size());
    at += im.patches().size() / sizeof(float);
  }
  Tensor patches = be.Alloc(DType::kF32, {patch_rows, width});
  be.FromHost(host.data(), &patches);
  // Every rank runs this for the same plan, so the sharded tower's collectives line up across the ranks.
  const Tensor rows = RunVisionTower(be, config.vision, model.impl().weights().vision, patches, grids,
                                     &model.impl().comm());
  Tensor aligner = AllocateTensor(DType::kF32, rows.shape);
  be.ToHost(rows, aligner.data);
  for (const ImageSpan& span : chunk.images)
    if (span.perm.size() > static_cast<size_t>(aligner.shape[0]))
      throw std::runtime_error("plan: an image's perm is longer than its aligner grid");
  return BuildStepImageRows(chunk, aligner, model.impl().weights().vision, 0, n);
}

}  // namespace dsmesh

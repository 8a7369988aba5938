// The image rows of a step (model/model.h StepImageRows) from an expanded prompt and the tower's output:
// what the worker puts beside the tokens of a prefill step that holds an image block (docs/vision.md).
// IMAGE slots take the aligner's rows (reordered by ImageSpan::perm), IMAGE_START / PAD / NEWLINE / END the
// learned sentinel vectors, as vLLM's embed_input_ids does; every block row (alignment pad included) is an
// image row for routing; each IMAGE_START .. IMAGE_END is a span.
#pragma once

#include <cstdint>
#include <vector>

#include "common/vision/image_prompt.h"
#include "model/model.h"
#include "model/weights.h"

namespace dsmesh {

// Rows of prompt positions [from, to) (one step of the prompt; indices in the result are relative to
// `from`). aligner: host f32 [sum of the images' llm_h * llm_w, hidden], image after image, each row-major
// (RunVisionTower's output copied to the host). Throws std::runtime_error when the step would cut an
// image span (an image is prefilled in one step) or the aligner rows do not match the images.
StepImageRows BuildStepImageRows(const ExpandedPrompt& prompt, const Tensor& aligner, const VisionWeights& vision,
                                 int64_t from, int64_t to);

// Where a prefill chunk of the prompt may end: the largest end <= want that does not fall inside an image
// block (a block is never split; returns the block's begin when want falls inside it, or want).
int64_t ImageSafeChunkEnd(const ExpandedPrompt& prompt, int64_t want);

}  // namespace dsmesh

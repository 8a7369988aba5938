// The image rows of one planned chunk (SequencePlan.images): runs the vision tower on the chunk's images
// and lays their rows out for the forward (model/image_rows.h). Every rank runs the same tower on the same
// patches (the tower is replicated), so all ranks feed identical embeddings.
#pragma once

#include "model/model.h"
#include "proto/mesh.pb.h"

namespace dsmesh {

// Empty for a chunk without images. Throws std::runtime_error for images the model cannot take (no tower,
// patches that do not match the grid, a block outside the chunk).
StepImageRows ImageRowsForChunk(Model& model, const SequencePlan& plan);

}  // namespace dsmesh

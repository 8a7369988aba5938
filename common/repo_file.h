// Finds a file committed to this repository (test vectors, reference tables) by its path from the
// repository root, e.g. "kernels/exl3/testdata/exl3_codebooks.safetensors", wherever the program runs.
#pragma once

#include <string>

namespace dsmesh {

// The first existing one of: `relative` from the working directory (a Bazel test's runfiles, or the
// repository root), from the running executable's Bazel runfiles (<exe>.runfiles/dsmesh/), and from
// $DSMESH_ROOT. Throws std::runtime_error naming every place it looked when none exists.
std::string RepoFile(const std::string& relative);

}  // namespace dsmesh

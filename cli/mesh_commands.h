// The CLI commands of the mesh (the table of commands is cli/commands.cc) and the pieces they share:
// mesh_commands.cc (up, bench on a mesh, logits/generate on a mesh) and long_prompt_bench.cc
// (`dsmesh bench --scenario ...`).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "common/flags.h"
#include "cli/launcher/local_mesh.h"
#include "kernels/cuda/device_choice.h"

namespace dsmesh {

// Where the repository keeps the trained default model (an EXL3 pack; tokenizer files linked from
// common/tokenizer/data/deepseek_v4).
inline constexpr char kTrainedModelDir[] = "models/dsv4-small";

// The model `dsmesh up` serves without --model: the trained pack in the checkout (absolute path), else
// the random tiny model `make-tiny` writes, cached under the data directory.
std::string DefaultModel();

// Flags every mesh-target command takes (--world N / --coordinator HOST:PORT, --model, ...).
extern const std::set<std::string> kMeshFlags;
// Coordinator flags that `up` and `bench --world` pass through unchanged (the coordinator checks them).
extern const std::vector<std::string> kCoordinatorFlags;

// A local mesh of `world` workers on `model`, all on `device` (ChooseDevice(f): several workers share one
// GPU), with the --kv-memory/--threads/coordinator flags of `f`.
LocalMeshOptions OptionsFromFlags(const Flags& f, const std::string& model, int world, const DeviceChoice& device);

// `dsmesh up`: a supervised local mesh (coordinator, workers, gateway) until Ctrl-C.
int RunUp(const std::vector<std::string>& args);
// `dsmesh bench --coordinator HOST:PORT | --world N`: per-step time split at each stream count.
int RunMeshBench(const std::vector<std::string>& args);
// `dsmesh bench --scenario NAME ...`.
int RunBenchScenario(const std::vector<std::string>& args);
// `dsmesh logits` / `dsmesh generate` with --world N or --coordinator HOST:PORT: the same output as the
// in-process commands of cli/model_commands/model_commands.h, computed by a mesh.
int RunLogitsMesh(const std::vector<std::string>& args);
int RunGenerateMesh(const std::vector<std::string>& args);

}  // namespace dsmesh

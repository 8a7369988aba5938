// The CLI commands of the mesh (the table of commands is cli/commands.cc) and the pieces they share with
// the mesh modes of `dsmesh bench` (cli/bench/mesh_bench.cc, cli/bench/scenario_bench.cc): up,
// logits/generate on a mesh, the mesh flags and the connection to a mesh.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli/launcher/local_mesh.h"
#include "common/flags.h"
#include "common/mesh/mesh_client.h"
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

// The mesh a command runs on: a client of --coordinator HOST:PORT, or a local mesh of --world N workers on
// --model started for the call (then `local` owns it until the target is destroyed), ready to serve.
struct MeshTarget {
  std::unique_ptr<LocalMesh> local;
  std::unique_ptr<MeshClient> client;
};

// Connects to or starts the mesh `f` names (exactly one of --coordinator / --world; UsageError otherwise)
// and waits until it is ready (--ready-timeout-s); a local child that exits first ends the wait with its
// name and log. `adjust` may change the local mesh's options before it starts (the bench's speculation on
// and off).
MeshTarget ConnectMesh(const Flags& f, const std::function<void(LocalMeshOptions&)>& adjust = nullptr);

// `dsmesh up`: a supervised local mesh (coordinator, workers, gateway) until Ctrl-C.
int RunUp(const std::vector<std::string>& args);
// `dsmesh logits` / `dsmesh generate` with --world N or --coordinator HOST:PORT: the same output as the
// in-process commands of cli/model_commands/model_commands.h, computed by a mesh.
int RunLogitsMesh(const std::vector<std::string>& args);
int RunGenerateMesh(const std::vector<std::string>& args);

}  // namespace dsmesh

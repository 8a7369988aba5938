#include "cli/bench/bench_mode.h"

#include "common/flags.h"

namespace dsmesh {
namespace {

// True when `--name` is given, as `--name value` or `--name=value`.
bool Given(const std::vector<std::string>& args, const std::string& name) {
  const std::string flag = "--" + name;
  for (const auto& a : args)
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  return false;
}

// Throws when both flags are given: `why` says what each one asks for.
void Exclusive(const std::vector<std::string>& args, const char* a, const char* b, const std::string& why) {
  if (Given(args, a) && Given(args, b))
    throw UsageError(std::string("give --") + a + " or --" + b + ", not both: " + why);
}

}  // namespace

BenchMode ChooseBenchMode(const std::vector<std::string>& args) {
  if (Given(args, "url")) {
    const std::string why = "--url measures a running HTTP endpoint; ";
    Exclusive(args, "url", "scenario", why + "--scenario starts its own local meshes");
    Exclusive(args, "url", "world", why + "--world starts a local mesh");
    Exclusive(args, "url", "coordinator", why + "--coordinator measures a mesh through its coordinator");
    Exclusive(args, "url", "device", why + "--device runs the model here or picks the mesh's device");
    return Given(args, "clients") ? BenchMode::kHttpLoad : BenchMode::kHttp;
  }
  if (Given(args, "clients"))
    throw UsageError("--clients is the HTTP load run's: give --url http://HOST:PORT too");
  if (Given(args, "scenario")) {
    Exclusive(args, "scenario", "coordinator",
              "--scenario starts its own local meshes (policy on and off) and takes --world N");
    return BenchMode::kScenario;
  }
  Exclusive(args, "world", "coordinator", "--world starts a local mesh; --coordinator measures a running one");
  if (Given(args, "device") && !Given(args, "world") && !Given(args, "coordinator")) return BenchMode::kInProcess;
  return BenchMode::kMesh;
}

}  // namespace dsmesh

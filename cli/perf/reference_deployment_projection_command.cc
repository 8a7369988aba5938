// `dsmesh project-reference` (cli/perf/reference_deployment_projection_command.h): reads the profiled rows
// and prints ProjectToReferenceDeployment's projection of each for the pack of --bits (default: the deployment's).
#include "cli/perf/reference_deployment_projection_command.h"

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/perf/reference_deployment_projection.h"
#include "common/flags.h"
#include "model/v4_flash_config.h"

namespace dsmesh {

int RunProjectReference(const std::vector<std::string>& args) {
  Flags f(args, {"profile", "bits"}, {});
  const std::string path = f.Require("profile");
  std::ifstream in(path);
  if (!in) throw UsageError("--profile " + path + ": cannot open the file");
  nlohmann::json rows;
  try {
    rows = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw UsageError("--profile " + path + ": not JSON (" + e.what() + ")");
  }
  if (!rows.is_array()) throw UsageError("--profile " + path + ": expected the array `dsmesh bench --json` writes");
  const ModelConfig c = ModelConfig::FromJson(kV4FlashConfigJson, "v4-flash");
  const Exl3BitsSpec bits = Exl3BitsSpec::Parse(f.Get("bits", "experts=2,dense=6"));
  int shown = 0;
  for (const nlohmann::json& r : rows) {
    if (!r.contains("profile") || !r["profile"].contains("phases")) continue;
    if (r.value("rows_per_stream", 1) != 1) continue;
    const nlohmann::json& prof = r["profile"];
    std::vector<MeasuredPhase> phases;
    for (const nlohmann::json& op : prof.value("ops", nlohmann::json::array()))
      phases.push_back({op.at("op").get<std::string>(), op.at("ms").get<double>()});
    phases.push_back({"(host gaps between ops)", prof.value("between_ops_ms", 0.0)});
    const int streams = r.at("streams").get<int>();
    const ReferenceDeploymentProjection p = ProjectToReferenceDeployment(c, bits, streams, r.at("context").get<int64_t>(), phases,
                                           r.at("ms_per_step").get<double>(), prof.at("step_ms").get<double>());
    std::printf("%s\n", p.Describe(streams).c_str());
    ++shown;
  }
  if (shown == 0) throw UsageError("--profile " + path + ": no row with a profile (run dsmesh bench with --profile)");
  return 0;
}

}  // namespace dsmesh

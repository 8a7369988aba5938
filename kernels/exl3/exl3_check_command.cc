// `dsmesh exl3-check --vectors FILE.safetensors`: verifies this library against exllamav3's test
// vectors, one line per group, non-zero exit on any mismatch.
#include <iostream>

#include "kernels/exl3/exl3_check_command.h"
#include "common/flags.h"
#include "common/safetensors.h"
#include "kernels/exl3/vector_check.h"

namespace dsmesh {

int RunExl3Check(const std::vector<std::string>& args) {
  Flags flags(args, {"vectors"});
  const std::string path = flags.Require("vectors");
  std::shared_ptr<SafetensorsFile> file = SafetensorsFile::Open(path);
  const std::vector<Exl3VectorCheck> checks = CheckExl3Vectors(*file);
  int failed = 0;
  for (const Exl3VectorCheck& c : checks) {
    std::cout << c.ToLine() << "\n";
    if (!c.ok) ++failed;
  }
  if (checks.empty()) {
    std::cerr << "exl3-check: " << path << " contains no EXL3 test vectors\n";
    return 1;
  }
  std::cout << path << ": " << checks.size() - failed << " of " << checks.size() << " groups match\n";
  return failed ? 1 : 0;
}

}  // namespace dsmesh

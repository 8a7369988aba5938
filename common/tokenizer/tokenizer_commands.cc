// CLI: `dsmesh tokenize` and `dsmesh detokenize`, thin wrappers over Tokenizer for scripts and
// debugging (the gateway links the library directly).
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <iostream>

#include "common/tokenizer/tokenizer_commands.h"
#include "common/flags.h"
#include "common/tokenizer/tokenizer.h"

namespace dsmesh {

int RunTokenize(const std::vector<std::string>& args) {
  const Flags flags(args, {"tokenizer", "text-file", "add-special-tokens"}, {"add-special-tokens"});
  const auto tokenizer = Tokenizer::Load(flags.Require("tokenizer"));
  const std::string path = flags.Require("text-file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open text file");
  std::ostringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids;
  try {
    ids = tokenizer->Encode(text.str(), flags.GetBool("add-special-tokens", false));
  } catch (const InvalidUtf8Error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  std::cout << nlohmann::json{{"ids", ids}}.dump() << "\n";
  return 0;
}

int RunDetokenize(const std::vector<std::string>& args) {
  const Flags flags(args, {"tokenizer", "ids", "skip-special-tokens"}, {"skip-special-tokens"});
  const auto tokenizer = Tokenizer::Load(flags.Require("tokenizer"));
  std::vector<int32_t> ids;
  std::stringstream list(flags.Require("ids"));
  for (std::string item; std::getline(list, item, ',');) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < INT32_MIN || v > INT32_MAX)
      throw UsageError("--ids: '" + item + "' is not an integer (expected e.g. --ids 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
  }
  const std::string text = tokenizer->Decode(ids, flags.GetBool("skip-special-tokens", false));
  std::cout << nlohmann::json{{"text", text}}.dump() << "\n";
  return 0;
}

}  // namespace dsmesh

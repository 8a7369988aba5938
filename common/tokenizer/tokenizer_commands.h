// `dsmesh tokenize` and `dsmesh detokenize` (the table of commands is cli/commands.cc).
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// --tokenizer DIR --text-file F [--add-special-tokens]: prints {"ids": [...]}.
int RunTokenize(const std::vector<std::string>& args);
// --tokenizer DIR --ids 1,2,3 [--skip-special-tokens]: prints {"text": "..."}.
int RunDetokenize(const std::vector<std::string>& args);

}  // namespace dsmesh

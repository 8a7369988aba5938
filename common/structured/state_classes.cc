#include "common/structured/state_classes.h"

#include <string_view>
#include <unordered_map>

namespace dsmesh::structured {

std::vector<int32_t> EquivalentStates(size_t n, const std::vector<char>& accepting, const int32_t* trans,
                                      const std::vector<uint8_t>& reps, int32_t* num_classes) {
  std::vector<int32_t> cls(n), next(n);
  int32_t count = 0;
  {
    int32_t id[2] = {-1, -1};
    for (size_t s = 0; s < n; ++s) {
      int32_t& c = id[accepting[s] ? 1 : 0];
      if (c < 0) c = count++;
      cls[s] = c;
    }
  }
  // Each round a state's signature is (its class, the class after each representative byte); states with
  // equal signatures stay together. The partition only gets finer, so an unchanged count means stable.
  const size_t width = reps.size() + 1;
  std::vector<int32_t> sig(n * width);
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(n * 2);
  for (;;) {
    for (size_t s = 0; s < n; ++s) {
      int32_t* row = &sig[s * width];
      row[0] = cls[s];
      const int32_t* t = trans + s * 256;
      for (size_t k = 0; k < reps.size(); ++k) row[k + 1] = t[reps[k]] < 0 ? -1 : cls[t[reps[k]]];
    }
    ids.clear();
    for (size_t s = 0; s < n; ++s) {
      std::string_view key(reinterpret_cast<const char*>(&sig[s * width]), width * sizeof(int32_t));
      next[s] = ids.emplace(key, static_cast<int32_t>(ids.size())).first->second;
    }
    cls.swap(next);
    const int32_t refined = static_cast<int32_t>(ids.size());
    if (refined == count) break;
    count = refined;
  }
  *num_classes = count;
  return cls;
}

}  // namespace dsmesh::structured

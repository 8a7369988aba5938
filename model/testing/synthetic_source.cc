#include "model/testing/synthetic_source.h"

#include <stdexcept>

namespace dsmesh {

SyntheticSpec ParseSyntheticSource(const std::string& source) {
  if (!IsSyntheticSource(source)) throw std::invalid_argument(source + ": not a synthetic:NAME model source");
  const std::string rest = source.substr(std::string(kSyntheticPrefix).size());
  const size_t colon = rest.find(':');
  SyntheticSpec s;
  s.base = rest.substr(0, colon);
  if (s.base.empty()) throw std::invalid_argument(source + ": expected synthetic:v4-flash or synthetic:DIR");
  std::string extra;
  if (colon != std::string::npos) {
    std::string opts = rest.substr(colon + 1);
    size_t start = 0;
    while (start <= opts.size()) {
      const size_t comma = opts.find(',', start);
      const std::string item = opts.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      start = comma == std::string::npos ? opts.size() + 1 : comma + 1;
      if (item.empty()) continue;
      if (item.rfind("seed=", 0) == 0) {
        const std::string v = item.substr(5);
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
          throw std::invalid_argument(source + ": seed must be a non-negative integer, got '" + v + "'");
        s.seed = std::stoull(v);
      } else {
        extra += (extra.empty() ? "" : ",") + item;
      }
    }
  }
  // Items other than seed are the pack's bits; experts and dense default to the reference deployment's 2 and 6.
  std::string spec = extra;
  if (extra.find("experts=") == std::string::npos) spec = "experts=2" + std::string(spec.empty() ? "" : ",") + spec;
  if (spec.find("dense=") == std::string::npos) spec += ",dense=6";
  try {
    s.bits = Exl3BitsSpec::Parse(spec);
  } catch (const std::exception& e) {
    throw std::invalid_argument(source + ": " + e.what());
  }
  return s;
}

}  // namespace dsmesh

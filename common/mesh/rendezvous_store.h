// The key-value store workers rendezvous through (Gloo addresses, the NCCL unique id). Keys carry the
// mesh epoch as prefix, so a re-formed mesh never reads a dead epoch's addresses; Clear() drops old ones.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dsmesh {

class RendezvousStore {
 public:
  void Set(const std::string& key, std::string value);
  // Waits until every key exists; returns their values in order. On timeout throws std::runtime_error
  // naming the missing keys.
  std::vector<std::string> Get(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // The value of `key`, or nothing when it is not set (never waits).
  std::optional<std::string> Find(const std::string& key);
  // Drops every key not starting with `keep_prefix`.
  void ClearExcept(const std::string& keep_prefix);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

}  // namespace dsmesh

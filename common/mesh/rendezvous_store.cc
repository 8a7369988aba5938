#include "common/mesh/rendezvous_store.h"

#include <stdexcept>

namespace dsmesh {

void RendezvousStore::Set(const std::string& key, std::string value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = std::move(value);
  }
  cv_.notify_all();
}

std::vector<std::string> RendezvousStore::Get(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all_present = [&] {
    for (const auto& k : keys)
      if (!values_.count(k)) return false;
    return true;
  };
  if (!cv_.wait_for(lock, timeout, all_present)) {
    std::string missing;
    for (const auto& k : keys)
      if (!values_.count(k)) missing += (missing.empty() ? "" : ", ") + k;
    throw std::runtime_error("rendezvous store: timed out after " + std::to_string(timeout.count()) +
                             " ms waiting for " + missing);
  }
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(values_[k]);
  return out;
}

std::optional<std::string> RendezvousStore::Find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

void RendezvousStore::ClearExcept(const std::string& keep_prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = values_.begin(); it != values_.end();)
    it = it->first.rfind(keep_prefix, 0) == 0 ? std::next(it) : values_.erase(it);
}

}  // namespace dsmesh

// The table of streams that launch with programmatic dependent launch (pdl_streams.h): a fixed array
// read without locks on every launch (launches outnumber registrations by millions), written under a
// mutex. With no stream registered (the default) a launch costs one relaxed load.
#include "kernels/cuda/pdl_streams.h"

#include <mutex>
#include <stdexcept>

namespace dsmesh {
namespace {

struct Slot {
  std::atomic<cudaStream_t> stream{nullptr};
  std::atomic<std::atomic<int64_t>*> launches{nullptr};
};

Slot g_slots[kMaxPdlStreams];
std::atomic<int> g_registered{0};
std::mutex g_write;

}  // namespace

void EnablePdlOnStream(cudaStream_t stream, std::atomic<int64_t>* launches) {
  if (!stream || !launches) throw std::invalid_argument("EnablePdlOnStream: null stream or counter");
  const std::lock_guard<std::mutex> lock(g_write);
  Slot* free_slot = nullptr;
  for (Slot& s : g_slots) {
    if (s.stream.load() == stream) {
      s.launches.store(launches);
      return;
    }
    if (!free_slot && !s.stream.load()) free_slot = &s;
  }
  if (!free_slot) throw std::runtime_error("EnablePdlOnStream: more than kMaxPdlStreams streams at once");
  free_slot->launches.store(launches);
  free_slot->stream.store(stream);
  g_registered.fetch_add(1);
}

void DisablePdlOnStream(cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(g_write);
  for (Slot& s : g_slots)
    if (stream && s.stream.load() == stream) {
      s.stream.store(nullptr);
      s.launches.store(nullptr);
      g_registered.fetch_sub(1);
    }
}

std::atomic<int64_t>* PdlLaunchCounter(cudaStream_t stream) {
  if (!stream || g_registered.load(std::memory_order_relaxed) == 0) return nullptr;
  for (const Slot& s : g_slots)
    if (s.stream.load(std::memory_order_acquire) == stream) return s.launches.load(std::memory_order_acquire);
  return nullptr;
}

}  // namespace dsmesh

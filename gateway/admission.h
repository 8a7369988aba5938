// Admission control in front of the mesh (serving-conventions.md section 3: the scheduler itself never
// refuses, so refusal happens here). A request is admitted while this gateway has fewer than
// slots + max_queued requests in flight, where slots is the coordinator's max_num_seqs; beyond that
// it gets 429 at once instead of waiting without bound. The count is per gateway process.
#pragma once

#include <atomic>
#include <memory>

namespace dsmesh {

class Admission {
 public:
  explicit Admission(int max_queued) : max_queued_(max_queued) {}

  // Holds one in-flight slot until destroyed.
  class Ticket {
   public:
    explicit Ticket(std::atomic<int>* counter) : counter_(counter) {}
    ~Ticket() { counter_->fetch_sub(1); }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    std::atomic<int>* counter_;
  };

  // nullptr when full.
  std::unique_ptr<Ticket> TryAdmit(int slots) {
    const int limit = slots + max_queued_;
    int current = in_flight_.load();
    while (current < limit) {
      if (in_flight_.compare_exchange_weak(current, current + 1)) return std::make_unique<Ticket>(&in_flight_);
    }
    return nullptr;
  }

  int in_flight() const { return in_flight_.load(); }
  int max_queued() const { return max_queued_; }

 private:
  const int max_queued_;
  std::atomic<int> in_flight_{0};
};

}  // namespace dsmesh

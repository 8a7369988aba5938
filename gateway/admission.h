// The gateway's side of admission. The bound itself is held by the coordinator so that several gateways
// share one limit: a Generate arriving while max_num_seqs + max-queued requests are running or waiting in
// the coordinator is refused with RESOURCE_EXHAUSTED, which the gateway answers as 429 queue_full (before
// any byte of a stream: the coordinator's initial metadata says "admitted"). This gateway's --max-queued,
// when given, travels with each request (GenerateRequest.max_queued) and can only lower the coordinator's
// bound. What stays here is the count of this gateway's own requests in flight (drain, /metrics).
#pragma once

#include <atomic>
#include <memory>
#include <optional>

namespace dsmesh {

class Admission {
 public:
  explicit Admission(std::optional<int> max_queued) : max_queued_(max_queued) {}

  // Holds one in-flight count until destroyed.
  class Ticket {
   public:
    explicit Ticket(std::atomic<int>* counter) : counter_(counter) { counter_->fetch_add(1); }
    ~Ticket() { counter_->fetch_sub(1); }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    std::atomic<int>* counter_;
  };

  std::unique_ptr<Ticket> Enter() { return std::make_unique<Ticket>(&in_flight_); }

  int in_flight() const { return in_flight_.load(); }
  // This gateway's --max-queued (forwarded to the coordinator), if given.
  const std::optional<int>& max_queued() const { return max_queued_; }

 private:
  const std::optional<int> max_queued_;
  std::atomic<int> in_flight_{0};
};

}  // namespace dsmesh

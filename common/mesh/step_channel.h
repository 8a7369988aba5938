// The per-step path between a coordinator and a worker on the same machine: a unix-domain stream socket
// (abstract namespace, so nothing is left in the file system when a worker is killed) that the worker
// listens on and the coordinator connects to after each mesh formation. The coordinator writes each
// step's CoordinatorMessage (the plan) on it and the worker answers with its WorkerMessage (the result),
// each as a frame: a 4-byte little-endian length, then the serialized message.
//
// Why it exists: over the gRPC Session stream every plan and result passes through gRPC's poller threads,
// the session's reader thread and the transport's lock (several thread wake-ups per step, most of the
// control plane's time). On this socket the engine thread writes the plan and itself waits in poll() for
// the result, and one worker thread waits in poll() for the plan: one wake-up on each side. Everything
// else (hello, formation, heartbeats, reset, drain) stays on the Session stream.
//
// Who may use it: the worker offers its socket's name through the rendezvous store (an authenticated
// call); the coordinator connects and checks with SO_PEERCRED that the listening process is the registered
// worker (its pid) and of its own uid; the worker accepts only a peer of its own uid. Whatever fails
// (another host, another pid namespace or user, DSMESH_STEP_CHANNEL=off on the worker) leaves the steps on
// the Session stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsmesh {

// The rendezvous-store key (under the epoch's prefix) of rank `rank`'s socket name.
std::string StepChannelKey(int rank);

// Worker side: a listening socket under a fresh abstract name.
class StepChannelListener {
 public:
  // Throws std::runtime_error when the socket cannot be made.
  StepChannelListener();
  ~StepChannelListener();
  StepChannelListener(const StepChannelListener&) = delete;
  StepChannelListener& operator=(const StepChannelListener&) = delete;

  // What the coordinator connects to (the value offered in the store).
  const std::string& name() const { return name_; }
  // The listening descriptor (non-blocking), to poll for a connection.
  int fd() const { return fd_; }
  // The newest pending connection from a process of this uid (older ones, and other users', are closed),
  // or -1 when none is pending. Never blocks. The caller owns the descriptor (non-blocking).
  int AcceptNewest();

 private:
  int fd_ = -1;
  std::string name_;
};

// Coordinator side: connects to `name` and checks that the listening process is `expected_pid` and runs as
// this process's uid. Returns the connected descriptor (non-blocking, for FrameReader), or -1 with *why set.
int ConnectStepChannel(const std::string& name, int64_t expected_pid, std::string* why);

// Writes one frame, waiting (also on a non-blocking descriptor) until all of it is written. False when the
// peer is gone (no SIGPIPE).
bool WriteFrame(int fd, const std::string& bytes);

// Collects frames from a non-blocking descriptor as their bytes arrive.
class FrameReader {
 public:
  enum class Status { kOpen, kClosed, kBad };
  static constexpr uint32_t kMaxFrameBytes = 1u << 30;

  // Reads everything available now and appends each completed frame to *frames. kClosed: the peer closed
  // the socket (or reading failed); kBad: a frame announced more than kMaxFrameBytes. Frames completed
  // before either are still appended.
  Status ReadAvailable(int fd, std::vector<std::string>* frames);

 private:
  std::string buf_;
};

}  // namespace dsmesh

// The step results' local path from a worker to a coordinator on the same machine: a unix-domain stream
// socket (abstract namespace, so nothing is left in the file system when a worker is killed) that the
// worker listens on and the coordinator connects to after each mesh formation. It carries serialized
// WorkerMessages (a 4-byte little-endian length, then the bytes), from the worker to the coordinator only.
//
// Why it exists: over the gRPC Session stream a result reaches the engine thread through gRPC's poller
// threads and the session's reader thread (several thread wake-ups per step, most of the control plane's
// time); on this socket the engine thread itself waits in poll() and reads the result (one wake-up), and
// the worker's write is one send(). Plans still go over the Session stream, as does everything else.
//
// Who may use it: the worker offers its socket's name through the rendezvous store (an authenticated
// call); the coordinator connects and checks with SO_PEERCRED that the listening process is the registered
// worker (its pid); the worker accepts only a peer of its own uid. Whatever fails (another host, another
// pid namespace, DSMESH_RESULT_CHANNEL=off on the worker) leaves the results on the Session stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsmesh {

// The rendezvous-store key (under the epoch's prefix) of rank `rank`'s socket name.
std::string ResultChannelKey(int rank);

// Worker side: a listening socket under a fresh abstract name.
class ResultChannelListener {
 public:
  // Throws std::runtime_error when the socket cannot be made.
  ResultChannelListener();
  ~ResultChannelListener();
  ResultChannelListener(const ResultChannelListener&) = delete;
  ResultChannelListener& operator=(const ResultChannelListener&) = delete;

  // What the coordinator connects to (the value offered in the store).
  const std::string& name() const { return name_; }
  // The newest pending connection from a process of this uid (older ones, and other users', are closed),
  // or -1 when none is pending. Never blocks. The caller owns the descriptor (blocking writes).
  int AcceptNewest();

 private:
  int fd_ = -1;
  std::string name_;
};

// Coordinator side: connects to `name` and checks that the listening process is `expected_pid`. Returns the
// connected descriptor (non-blocking, for FrameReader), or -1 with *why set.
int ConnectResultChannel(const std::string& name, int64_t expected_pid, std::string* why);

// Writes one frame, blocking until all of it is written. False when the peer is gone (no SIGPIPE).
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

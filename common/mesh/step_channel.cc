#include "common/mesh/step_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>

namespace dsmesh {
namespace {

// The address of abstract name `name`: sun_path starts with a NUL, and the length ends the name.
socklen_t AbstractAddress(const std::string& name, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(a->sun_path)) return 0;
  std::memcpy(a->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

bool PeerCredentials(int fd, ucred* c) {
  socklen_t len = sizeof(*c);
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, c, &len) == 0 && len == sizeof(*c);
}

}  // namespace

std::string StepChannelKey(int rank) { return "step_channel/" + std::to_string(rank); }

StepChannelListener::StepChannelListener() {
  std::random_device rd;
  char suffix[17];
  std::snprintf(suffix, sizeof(suffix), "%08x%08x", rd(), rd());
  name_ = "dsmesh-steps-" + std::to_string(getpid()) + "-" + suffix;
  sockaddr_un a;
  const socklen_t len = AbstractAddress(name_, &a);
  fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd_, 8) != 0) {
    const std::string err = std::strerror(errno);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    throw std::runtime_error("step channel: cannot listen on @" + name_ + ": " + err);
  }
}

StepChannelListener::~StepChannelListener() {
  if (fd_ >= 0) close(fd_);
}

int StepChannelListener::AcceptNewest() {
  int newest = -1;
  for (;;) {
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return newest;  // EAGAIN: nothing more pending
    }
    ucred c{};
    if (!PeerCredentials(fd, &c) || c.uid != getuid()) {
      close(fd);
      continue;
    }
    if (newest >= 0) close(newest);
    newest = fd;
  }
}

int ConnectStepChannel(const std::string& name, int64_t expected_pid, std::string* why) {
  sockaddr_un a;
  const socklen_t len = AbstractAddress(name, &a);
  if (len == 0) {
    *why = "bad socket name '" + name + "'";
    return -1;
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    *why = "cannot connect to @" + name + " (" + std::strerror(errno) +
           "; a worker on another host or network namespace)";
    close(fd);
    return -1;
  }
  ucred c{};
  if (!PeerCredentials(fd, &c) || c.pid != expected_pid) {
    *why = "@" + name + " is held by pid " + std::to_string(c.pid) + ", not the worker's pid " +
           std::to_string(expected_pid) + " (another pid namespace?)";
    close(fd);
    return -1;
  }
  if (c.uid != getuid()) {  // the worker would refuse this process
    *why = "the worker runs as uid " + std::to_string(c.uid) + ", this process as " + std::to_string(getuid());
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

bool WriteFrame(int fd, const std::string& bytes) {
  if (bytes.size() > FrameReader::kMaxFrameBytes) return false;
  const uint32_t n = static_cast<uint32_t>(bytes.size());
  const unsigned char header[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                                   static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  iovec iov[2] = {{const_cast<unsigned char*>(header), sizeof(header)},
                  {const_cast<char*>(bytes.data()), bytes.size()}};
  size_t left = sizeof(header) + bytes.size();
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = 2;
  while (left > 0) {
    const ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // the socket's buffer is full: wait for the reader
        pollfd p{fd, POLLOUT, 0};
        if (poll(&p, 1, -1) < 0 && errno != EINTR) return false;
        continue;
      }
      return false;
    }
    left -= static_cast<size_t>(w);
    // Skip what was written: whole iovecs first, then into the partly written one.
    size_t done = static_cast<size_t>(w);
    while (m.msg_iovlen > 0 && done >= m.msg_iov[0].iov_len) {
      done -= m.msg_iov[0].iov_len;
      ++m.msg_iov;
      --m.msg_iovlen;
    }
    if (m.msg_iovlen > 0) {
      m.msg_iov[0].iov_base = static_cast<char*>(m.msg_iov[0].iov_base) + done;
      m.msg_iov[0].iov_len -= done;
    }
  }
  return true;
}

FrameReader::Status FrameReader::ReadAvailable(int fd, std::vector<std::string>* frames) {
  Status status = Status::kOpen;
  char chunk[65536];
  for (;;) {
    const ssize_t r = read(fd, chunk, sizeof(chunk));
    if (r > 0) {
      buf_.append(chunk, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    status = Status::kClosed;  // 0: the peer closed; < 0: a read error
    break;
  }
  size_t at = 0;
  while (buf_.size() - at >= 4) {
    const auto* h = reinterpret_cast<const unsigned char*>(buf_.data() + at);
    const uint32_t n = uint32_t(h[0]) | uint32_t(h[1]) << 8 | uint32_t(h[2]) << 16 | uint32_t(h[3]) << 24;
    if (n > kMaxFrameBytes) {
      status = Status::kBad;
      break;
    }
    if (buf_.size() - at - 4 < n) break;
    frames->emplace_back(buf_, at + 4, n);
    at += 4 + n;
  }
  buf_.erase(0, at);
  return status;
}

}  // namespace dsmesh

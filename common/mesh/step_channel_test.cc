// The step channel between two ends in this process (the listener's pid is this process's): frames of
// any size arrive whole and in order, a wrong expected pid is refused, the newest pending connection
// wins, and a closed peer or an oversized frame is reported.
#include "common/mesh/step_channel.h"

#include <poll.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace dsmesh {
namespace {

// Reads until `want` frames have arrived or the peer closed; returns the last status.
FrameReader::Status ReadFrames(int fd, FrameReader* reader, size_t want, std::vector<std::string>* frames) {
  FrameReader::Status st = FrameReader::Status::kOpen;
  while (frames->size() < want && st == FrameReader::Status::kOpen) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    st = reader->ReadAvailable(fd, frames);
  }
  return st;
}

TEST(StepChannel, FramesArriveWholeAndInOrder) {
  StepChannelListener listener;
  EXPECT_EQ(listener.AcceptNewest(), -1);  // nothing pending
  std::string why;
  const int reader_fd = ConnectStepChannel(listener.name(), getpid(), &why);
  ASSERT_GE(reader_fd, 0) << why;
  const int writer_fd = listener.AcceptNewest();
  ASSERT_GE(writer_fd, 0);

  // An empty frame, a small one, and one far larger than the socket buffer (written while read).
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  const std::vector<std::string> sent = {"", "result", big};
  std::thread writer([&] {
    for (const auto& s : sent) EXPECT_TRUE(WriteFrame(writer_fd, s));
  });
  FrameReader reader;
  std::vector<std::string> got;
  EXPECT_EQ(ReadFrames(reader_fd, &reader, sent.size(), &got), FrameReader::Status::kOpen);
  writer.join();
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_TRUE(got[i] == sent[i]) << "frame " << i;

  // The writer goes away: the reader is told, after any frame still in flight.
  EXPECT_TRUE(WriteFrame(writer_fd, "last"));
  close(writer_fd);
  got.clear();
  EXPECT_EQ(ReadFrames(reader_fd, &reader, 2, &got), FrameReader::Status::kClosed);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], "last");
  close(reader_fd);
}

TEST(StepChannel, RefusesAListenerOfAnotherPid) {
  StepChannelListener listener;
  std::string why;
  EXPECT_EQ(ConnectStepChannel(listener.name(), getpid() + 1, &why), -1);
  EXPECT_NE(why.find("not the worker's pid"), std::string::npos) << why;
  EXPECT_EQ(ConnectStepChannel("dsmesh-steps-no-such-name", getpid(), &why), -1);
  EXPECT_NE(why.find("cannot connect"), std::string::npos) << why;
}

TEST(StepChannel, NewestPendingConnectionWins) {
  StepChannelListener listener;
  std::string why;
  const int old_fd = ConnectStepChannel(listener.name(), getpid(), &why);
  const int new_fd = ConnectStepChannel(listener.name(), getpid(), &why);
  ASSERT_GE(old_fd, 0);
  ASSERT_GE(new_fd, 0);
  const int w = listener.AcceptNewest();
  ASSERT_GE(w, 0);
  EXPECT_TRUE(WriteFrame(w, "to the newest"));
  FrameReader reader;
  std::vector<std::string> got;
  ReadFrames(new_fd, &reader, 1, &got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], "to the newest");
  // The older connection was closed by the listener.
  FrameReader old_reader;
  got.clear();
  EXPECT_EQ(ReadFrames(old_fd, &old_reader, 1, &got), FrameReader::Status::kClosed);
  EXPECT_TRUE(got.empty());
  close(w);
  close(old_fd);
  close(new_fd);
}

// A connected pair: the coordinator's end `r` (reads results) and the worker's end `w`; -1 where it failed.
struct Connected {
  StepChannelListener listener;
  int r = -1, w = -1;
  Connected() {
    std::string why;
    r = ConnectStepChannel(listener.name(), getpid(), &why);
    w = listener.AcceptNewest();
  }
};

TEST(StepChannel, WriterToAClosedReaderFails) {
  Connected c;
  const int r = c.r, w = c.w;
  ASSERT_GE(r, 0);
  ASSERT_GE(w, 0);
  close(r);
  EXPECT_FALSE(WriteFrame(w, std::string(1 << 20, 'x')));
  close(w);
}

TEST(StepChannel, OversizedFrameIsBad) {
  Connected c;
  const int r = c.r, w = c.w;
  ASSERT_GE(r, 0);
  ASSERT_GE(w, 0);
  const unsigned char header[4] = {0xff, 0xff, 0xff, 0xff};
  ASSERT_EQ(write(w, header, 4), 4);
  FrameReader reader;
  std::vector<std::string> got;
  pollfd p{r, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  EXPECT_EQ(reader.ReadAvailable(r, &got), FrameReader::Status::kBad);
  close(w);
  close(r);
}

}  // namespace
}  // namespace dsmesh

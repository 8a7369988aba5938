// LogFollower: copies only complete new lines, keeps a partial line until it ends (or the writer is
// gone), starts at a file's end, and LastLines reads a tail.
#include "cli/launcher/log_follower.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace dsmesh {
namespace {

std::string TempFile(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name + "." + std::to_string(getpid());
}

void Append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::app) << text;
}

// What the follower wrote to its output so far.
std::string Output(std::FILE* out) {
  std::fflush(out);
  std::rewind(out);
  std::string s;
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), out)) > 0) s.append(buf, n);
  return s;
}

TEST(LogFollower, CopiesCompleteLinesFromWhereTheFileEnded) {
  const std::string path = TempFile("follow.log");
  std::remove(path.c_str());
  Append(path, "written before\n");
  std::FILE* out = std::tmpfile();
  LogFollower f(out);
  f.Follow(path);
  f.Pump();
  EXPECT_EQ(Output(out), "");
  Append(path, "one\ntw");
  std::fseek(out, 0, SEEK_END);
  f.Pump();
  EXPECT_EQ(Output(out), "one\n");
  Append(path, "o\nthree");
  std::fseek(out, 0, SEEK_END);
  f.Pump();
  EXPECT_EQ(Output(out), "one\ntwo\n");
  std::fseek(out, 0, SEEK_END);
  f.Pump(/*flush_partial=*/true);
  EXPECT_EQ(Output(out), "one\ntwo\nthree\n");
  std::fclose(out);
}

TEST(LogFollower, FollowsAFileThatDoesNotExistYet) {
  const std::string path = TempFile("later.log");
  std::remove(path.c_str());
  std::FILE* out = std::tmpfile();
  LogFollower f(out);
  f.Follow(path);
  f.Pump();
  Append(path, "hello\n");
  std::fseek(out, 0, SEEK_END);
  f.Pump();
  EXPECT_EQ(Output(out), "hello\n");
  std::fclose(out);
}

TEST(LogFollower, LastLinesReadsTheTail) {
  const std::string path = TempFile("tail.log");
  std::remove(path.c_str());
  for (int i = 0; i < 100; ++i) Append(path, "line " + std::to_string(i) + "\n");
  Append(path, "no newline");
  EXPECT_EQ(LogFollower::LastLines(path, 3), (std::vector<std::string>{"line 98", "line 99", "no newline"}));
  EXPECT_EQ(LogFollower::LastLines(path + ".missing", 3), std::vector<std::string>{});
  // A file larger than the 64 KiB read: the first, cut line is dropped.
  for (int i = 0; i < 10000; ++i) Append(path, "filler line " + std::to_string(i) + "\n");
  const auto tail = LogFollower::LastLines(path, 100000);
  EXPECT_LT(tail.size(), 10000u);
  EXPECT_EQ(tail.back(), "filler line 9999");
  EXPECT_EQ(tail.front().rfind("filler line ", 0), 0u);
}

}  // namespace
}  // namespace dsmesh

// Follows the log files `dsmesh up` gives its children (DIR/NAME.log, appended to across restarts): each
// Pump() copies the complete lines written since the last one to an output stream (up's stderr), so the
// console shows every child's output as before; LastLines() reads a file's tail for a closing message.
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace dsmesh {

class LogFollower {
 public:
  explicit LogFollower(std::FILE* out) : out_(out) {}

  // Starts following `path` from its current end (earlier content is not copied).
  void Follow(const std::string& path);
  // Copies the new complete lines of every followed file; with `flush_partial`, also a last line that
  // has no newline yet (once the writer is gone).
  void Pump(bool flush_partial = false);
  // The last `n` lines of the file at `path` (at most the last 64 KiB of it are read).
  static std::vector<std::string> LastLines(const std::string& path, int n);

 private:
  struct File {
    long offset = 0;
    std::string partial;  // read, not yet ended by '\n'
  };
  std::FILE* out_;
  std::map<std::string, File> files_;
};

}  // namespace dsmesh

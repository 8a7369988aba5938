#include "cli/launcher/log_follower.h"

#include <sys/stat.h>

#include <algorithm>

namespace dsmesh {

void LogFollower::Follow(const std::string& path) {
  if (files_.count(path)) return;
  struct stat st;
  files_[path].offset = stat(path.c_str(), &st) == 0 ? static_cast<long>(st.st_size) : 0;
}

void LogFollower::Pump(bool flush_partial) {
  for (auto& [path, f] : files_) {
    std::FILE* in = std::fopen(path.c_str(), "rb");
    if (in == nullptr) continue;
    if (std::fseek(in, f.offset, SEEK_SET) == 0) {
      char buf[8192];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), in)) > 0) {
        f.offset += static_cast<long>(n);
        f.partial.append(buf, n);
      }
    }
    std::fclose(in);
    const size_t end = f.partial.rfind('\n');
    if (end != std::string::npos) {
      std::fwrite(f.partial.data(), 1, end + 1, out_);
      f.partial.erase(0, end + 1);
    }
    if (flush_partial && !f.partial.empty()) {
      std::fprintf(out_, "%s\n", f.partial.c_str());
      f.partial.clear();
    }
  }
  std::fflush(out_);
}

std::vector<std::string> LogFollower::LastLines(const std::string& path, int n) {
  std::vector<std::string> lines;
  std::FILE* in = std::fopen(path.c_str(), "rb");
  if (in == nullptr) return lines;
  std::fseek(in, 0, SEEK_END);
  const long size = std::ftell(in);
  const long start = std::max(0L, size - 65536L);
  std::fseek(in, start, SEEK_SET);
  std::string text(static_cast<size_t>(size - start), '\0');
  text.resize(std::fread(text.data(), 1, text.size(), in));
  std::fclose(in);
  size_t pos = 0;
  if (start > 0) pos = text.find('\n') == std::string::npos ? text.size() : text.find('\n') + 1;  // a cut line
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (static_cast<int>(lines.size()) > n) lines.erase(lines.begin(), lines.end() - n);
  return lines;
}

}  // namespace dsmesh

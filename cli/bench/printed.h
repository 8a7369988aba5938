// What a printer writes to a FILE*, as a string (tests of the bench's printed reports).
#pragma once

#include <cstdio>
#include <string>

namespace dsmesh {

template <class F>
std::string Printed(F print) {
  std::FILE* f = std::tmpfile();
  print(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) s.append(buf, n);
  std::fclose(f);
  return s;
}

}  // namespace dsmesh

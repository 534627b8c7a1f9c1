#pragma once
// ReadFile: a whole file's bytes, for tests that check what a program wrote. Header only; tests only.

#include <fstream>
#include <iterator>
#include <string>

namespace minions::testing {

// The file's bytes; "" when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace minions::testing

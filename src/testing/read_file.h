#pragma once
// ReadFile: a whole file's bytes, for tests that check what a program wrote; ReadExistingFile:
// the same for a file the test needs (a fixture, a shipped file), failing the test when it is
// missing. Header only; tests only.

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

namespace minions::testing {

// The file's bytes; "" when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The file's bytes; a test failure naming `path` when it cannot be opened ("" then).
inline std::string ReadExistingFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace minions::testing

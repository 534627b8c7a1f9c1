#pragma once
// MakeTempDir: a fresh folder of this test process, under gtest's temporary directory.

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace minions::testing {

// A new folder named `prefix`-XXXXXX: its path. The caller removes it. Aborts when none can be
// made (no test could go on).
inline std::string MakeTempDir(const std::string& prefix) {
  std::string pattern = (std::filesystem::path(::testing::TempDir()) / (prefix + "-XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) std::abort();
  return pattern;
}

}  // namespace minions::testing

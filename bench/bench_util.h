#pragma once
// Small helpers the benchmark programs share.

#include <fstream>
#include <sstream>
#include <string>

#include "common/subprocess.h"

namespace minions::bench {

// The folder of this benchmark binary (the apps sit next to it).
inline std::string BinDir() {
  std::string self = CurrentExecutablePath();
  return self.substr(0, self.rfind('/'));
}

// A whole file ("" when unreadable).
inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace minions::bench

#pragma once
// Reads Prometheus text exposition into {"name{labels}": value} for tests: the key is the sample
// line up to its value, exactly as the server wrote it (labels in the server's order).

#include <map>
#include <sstream>
#include <string>

namespace minions::testing {

inline std::map<std::string, double> ParsePrometheusSamples(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto space = line.rfind(' ');
    if (space == std::string::npos) continue;
    std::string value = line.substr(space + 1);
    samples[line.substr(0, space)] = value == "+Inf" ? 1e300 : std::stod(value);
  }
  return samples;
}

}  // namespace minions::testing

#pragma once
// RandomHex: a name part that no other process or thread picks (object keys written side by side
// by several servers). Not a secret: credentials come from identity/token.h.
// Threads: any (each thread has its own generator).

#include <random>
#include <string>

namespace minions {

// `n` random lowercase hex digits.
inline std::string RandomHex(int n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  for (int i = 0; i < n; ++i) out += "0123456789abcdef"[rng() % 16];
  return out;
}

}  // namespace minions

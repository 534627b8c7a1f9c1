#pragma once
// NameIn: the name of an enum's value, from a table that lists the enum's names in the order of
// its values (0, 1, ... as declared). Pair each table with a static_assert that it has a name for
// every value: the check a switch naming every case would have had from the compiler.

#include <cstddef>

namespace minions {

template <typename Enum, size_t N>
constexpr const char* NameIn(const char* const (&names)[N], Enum value, const char* unknown = "?") {
  const auto i = static_cast<size_t>(value);
  return i < N ? names[i] : unknown;
}

}  // namespace minions

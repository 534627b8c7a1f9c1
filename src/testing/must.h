#pragma once
// Must: the value of a StatusOr a test cannot go on without. A failure is recorded, then thrown,
// which ends the test (gtest catches it) rather than reading an empty value.

#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"

namespace minions::testing {

template <typename T>
T Must(absl::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) throw std::runtime_error(std::string(result.status().message()));
  return std::move(result).value();
}

}  // namespace minions::testing

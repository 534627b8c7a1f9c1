#pragma once
// The GoogleTest matchers the tests in minions::testing use, named there once (instead of at the
// top of every test file). Header only; tests only.

#include <gmock/gmock.h>

namespace minions::testing {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

}  // namespace minions::testing

#pragma once
// Test checks on absl::Status and absl::StatusOr, for GoogleTest: ASSERT_OK(expr), EXPECT_OK(expr),
// ASSERT_OK_AND_ASSIGN(lhs, expr) and EXPECT_CODE(expr, kCode), where expr is either. A failure
// prints the status. Header only; tests only.

#include <gtest/gtest.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace minions::testing {

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace minions::testing

#define MINIONS_TESTING_CONCAT_INNER(a, b) a##b
#define MINIONS_TESTING_CONCAT(a, b) MINIONS_TESTING_CONCAT_INNER(a, b)
#define ASSERT_OK(expr)                                                     \
  do {                                                                      \
    const ::absl::Status _minions_st = ::minions::testing::StatusOf(expr);  \
    ASSERT_TRUE(_minions_st.ok()) << _minions_st;                           \
  } while (0)
#define EXPECT_OK(expr)                                                     \
  do {                                                                      \
    const ::absl::Status _minions_st = ::minions::testing::StatusOf(expr);  \
    EXPECT_TRUE(_minions_st.ok()) << _minions_st;                           \
  } while (0)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  MINIONS_TESTING_ASSIGN_IMPL(MINIONS_TESTING_CONCAT(_minions_result_, __LINE__), lhs, expr)
#define MINIONS_TESTING_ASSIGN_IMPL(result, lhs, expr) \
  auto result = (expr);                                \
  ASSERT_TRUE(result.ok()) << result.status();         \
  lhs = std::move(result).value()
#define EXPECT_CODE(expr, status_code) \
  EXPECT_EQ(::minions::testing::StatusOf(expr).code(), ::absl::StatusCode::status_code)

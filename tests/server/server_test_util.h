#pragma once
// Helpers shared by the server tests: status assertions, a temporary folder per test, and input
// lines in the OpenAI Batch format.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace minions::testing {

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

#define MINIONS_SRV_CONCAT_INNER(a, b) a##b
#define MINIONS_SRV_CONCAT(a, b) MINIONS_SRV_CONCAT_INNER(a, b)
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
  MINIONS_SRV_ASSIGN_IMPL(MINIONS_SRV_CONCAT(_minions_result_, __LINE__), lhs, expr)
#define MINIONS_SRV_ASSIGN_IMPL(result, lhs, expr) \
  auto result = (expr);                            \
  ASSERT_TRUE(result.ok()) << result.status();     \
  lhs = std::move(result).value()

// A fresh folder, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::path(::testing::TempDir()) / "minions-srv-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One OpenAI Batch request line (no newline).
inline std::string RequestLine(const std::string& custom_id, const std::string& prompt = "hello") {
  return absl::StrCat(R"({"custom_id":")", custom_id,
                      R"(","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":")",
                      prompt, R"("}]}})");
}

// A response line for `custom_id`, as a runner would write it (no newline).
inline std::string OutputLine(const std::string& custom_id, const std::string& text) {
  return absl::StrCat(R"({"custom_id":")", custom_id, R"(","response":{"status_code":200,"body":{"text":")", text,
                      R"("}},"error":null})");
}

}  // namespace minions::testing

#pragma once
// Shared by the identity tests: an in-memory store, a fake clock, and status assertions.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "identity/identity_admin.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"
#include "testing/identities.h"
#include "testing/must.h"

namespace minions::testing {

#define IDENTITY_EXPECT_CODE(expr, code_name)                                      \
  do {                                                                             \
    const auto& _result = (expr);                                                  \
    EXPECT_EQ(::minions::testing::CodeOf(_result), ::absl::StatusCode::code_name)  \
        << ::minions::testing::MessageOf(_result);                                 \
  } while (0)

inline absl::StatusCode CodeOf(const absl::Status& s) { return s.code(); }
template <typename T>
absl::StatusCode CodeOf(const absl::StatusOr<T>& s) {
  return s.status().code();
}
inline std::string MessageOf(const absl::Status& s) { return std::string(s.message()); }
template <typename T>
std::string MessageOf(const absl::StatusOr<T>& s) {
  return std::string(s.status().message());
}

class IdentityFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = testing::Must(SqliteMetadataStore::Open(":memory:", StoreOptions{}));
    admin_ = std::make_unique<IdentityAdmin>(store_.get(), &clock_);
  }

  // Issues a token that must be issued.
  IssuedToken MustIssue(Role role, const std::string& team = "", const std::string& principal = "someone",
                        std::optional<absl::Duration> ttl = std::nullopt) {
    IssueRequest request = testing::TokenRequest(role, team, principal);
    request.ttl = ttl;
    absl::StatusOr<IssuedToken> issued = admin_->Issue(request, "local");
    EXPECT_TRUE(issued.ok()) << issued.status();
    return issued.ok() ? *issued : IssuedToken{};
  }

  Team MustCreateTeam(const std::string& name, int64_t requests_per_second = 0, int max_priority = 10) {
    Team team;
    team.name = name;
    team.requests_per_second = requests_per_second;
    team.max_priority = max_priority;
    absl::StatusOr<Team> created = admin_->CreateTeam(team);
    EXPECT_TRUE(created.ok()) << created.status();
    return team;
  }

  FakeClock clock_;
  std::unique_ptr<SqliteMetadataStore> store_;
  std::unique_ptr<IdentityAdmin> admin_;
};

}  // namespace minions::testing

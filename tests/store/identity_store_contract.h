#pragma once
// The IdentityStore contract (identity_store_contract.cc): the MetadataStore contract's fixture
// with helpers for teams, credentials and enrolment. A backend instantiates it next to the
// MetadataStore contract, with the same factories:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, IdentityStoreContract, ::testing::Values(...));

#include "metadata_store_contract.h"

namespace minions {

// A hash-shaped string that differs per `seed` (the store never sees token text).
inline std::string FakeHash(int seed) {
  std::string hex = absl::StrCat(seed);
  return std::string(64 - hex.size(), 'a') + hex;
}

class IdentityStoreContract : public MetadataStoreContract {
 protected:
  TokenRecord Token(const std::string& id, Role role, const std::string& team, const std::string& principal,
                    int seed) {
    TokenRecord token;
    token.id = id;
    token.secret_hash = FakeHash(seed);
    token.role = role;
    token.team = team;
    token.principal = principal;
    token.scopes = DefaultScopes(role);
    token.uses_left = role == Role::kJoin ? 2 : -1;
    token.created_by = "local";
    token.created_at = now_;
    return token;
  }
  Team NewTeam(const std::string& name, int64_t max_active_jobs = 0) {
    Team team;
    team.name = name;
    team.max_priority = 5;
    team.max_active_jobs = max_active_jobs;
    team.requests_per_second = 20;
    team.created_at = now_;
    return team;
  }
  ExecutorInfo Info(const std::string& name) {
    ExecutorInfo info;
    info.name = name;
    info.os = "linux";
    info.memory_bytes = 8 * kGiB;
    info.runners = {"llama"};
    info.max_tasks = 4;
    return info;
  }
  // Adds the join token Enrol(10, ...) uses: "tok-join00000001" of the principal "laptops", 2 uses.
  void AddJoinToken() { Must(store_->AddToken(Token("tok-join00000001", Role::kJoin, "", "laptops", 10)), "AddToken"); }
  // Adds the join token (AddJoinToken) and enrols two executors with it, credentials 11 and 12.
  std::array<Executor, 2> EnrolTwo(const std::string& first, const std::string& second) {
    AddJoinToken();
    return {Must(Enrol(10, 11, first), "EnrolExecutor"), Must(Enrol(10, 12, second), "EnrolExecutor")};
  }
  // Enrols an executor with the join token of hash FakeHash(join_seed); its credential gets
  // FakeHash(credential_seed).
  absl::StatusOr<Executor> Enrol(int join_seed, int credential_seed, const std::string& name) {
    TokenRecord credential = Token(absl::StrCat("tok-cred", credential_seed), Role::kExecutor, "", "", credential_seed);
    return store_->EnrolExecutor(FakeHash(join_seed), credential, Info(name), now_, /*await_approval=*/false);
  }
};

}  // namespace minions

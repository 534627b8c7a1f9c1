#pragma once
// IdentityStore: the durable half of who may do what — teams and issued credentials — and the two
// operations that tie credentials to executors (enrolment, revocation). Every MetadataStore is
// one (metadata_store.h), so a credential and the executor it names change in one transaction.
//
// Contract (every implementation passes tests/store/identity_store_contract.cc), as for the
// MetadataStore: each method is one transaction, takes `now` rather than reading a clock, and
// applies the pure rules of model/identity.h. Tokens are stored only as records: the store never
// sees a token's text, only its SHA-256 (identity/token.h).
// Errors: NotFound for an unknown team, token or executor; AlreadyExists for a name or id taken;
// Unauthenticated when a join token cannot be traded; Unavailable when the backend cannot be
// reached.
// Threads: implementations are thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/identity.h"
#include "model/types.h"

namespace minions {

struct TokenFilter {
  std::string team;            // "": every team (and tokens without one)
  std::optional<Role> role;    // none: every role
  std::string principal;       // "": everyone
  bool include_revoked = false;
};

class IdentityStore {
 public:
  virtual ~IdentityStore() = default;

  // --- teams ---
  // AlreadyExists when a team of that name exists. Every store starts with the team "default".
  virtual absl::StatusOr<Team> CreateTeam(const Team& team) = 0;
  // Replaces the settings of an existing team (its creation time stays); NotFound otherwise.
  virtual absl::StatusOr<Team> UpdateTeam(const Team& team) = 0;
  virtual absl::StatusOr<Team> GetTeam(const std::string& name) = 0;
  virtual absl::StatusOr<std::vector<Team>> ListTeams() = 0;
  // Adds `delta` bytes to the team's count of `kind` (Team::file_bytes, result_bytes) and answers
  // the team as it is then. With `enforce`, a positive delta that would take the count past the
  // team's limit (max_file_bytes, max_result_bytes; 0: none) is refused with ResourceExhausted,
  // naming the limit and the verb that raises it, and nothing is added. A negative delta never
  // takes the count below 0. NotFound for an unknown team. One transaction: two servers charging
  // the same team at once cannot both pass its limit.
  virtual absl::StatusOr<Team> ChargeTeamBytes(const std::string& team, TeamBytes kind, int64_t delta,
                                               bool enforce) = 0;

  // --- credentials ---
  // Stores a freshly issued credential. NotFound when it names a team that does not exist;
  // AlreadyExists when its id or hash is taken.
  virtual absl::Status AddToken(const TokenRecord& token) = 0;
  // The credential whose text hashes to `secret_hash`, revoked and expired ones included (the
  // caller applies CheckUsable); NotFound when there is none.
  virtual absl::StatusOr<TokenRecord> FindToken(const std::string& secret_hash) = 0;
  virtual absl::StatusOr<TokenRecord> GetToken(const std::string& token_id) = 0;
  // Newest first.
  virtual absl::StatusOr<std::vector<TokenRecord>> ListTokens(const TokenFilter& filter) = 0;
  // Revokes a credential; a revoked one keeps its first revocation time. NotFound when unknown.
  virtual absl::StatusOr<TokenRecord> RevokeToken(const std::string& token_id, absl::Time now) = 0;
  // Records that these credentials were used at `at` (last_used_at never moves back). Unknown ids
  // are ignored.
  virtual absl::Status RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) = 0;
  // The ids of the credentials revoked at or after `since` (by RevokeToken or RevokeExecutor):
  // what a server that caches credentials drops (identity/authenticator.h), in one query.
  virtual absl::StatusOr<std::vector<std::string>> RevokedTokensSince(absl::Time since) = 0;

  // --- executors ---
  // Trades a join token for an executor, all or nothing: checks the join token whose text hashes
  // to `join_secret_hash` (CheckUsable; Unauthenticated, as for an unknown one, otherwise), takes
  // one of its uses, registers a new executor under a fresh id with `info`, and stores
  // `credential` (role executor; its principal is set to the new executor's id).
  // `await_approval`: the new executor is pending (no leases) until ApproveExecutor.
  // Returns the executor; `credential` is completed with its id.
  virtual absl::StatusOr<Executor> EnrolExecutor(const std::string& join_secret_hash, TokenRecord& credential,
                                                 const ExecutorInfo& info, absl::Time now, bool await_approval) = 0;
  // Cuts an executor off, all or nothing: its credentials are revoked, it becomes `revoked` (it
  // will never lease, heartbeat its way back or register again), and the tasks it runs go back to
  // pending at once without counting as failures (committed checkpoints stay). Idempotent.
  // NotFound when unknown.
  virtual absl::StatusOr<Executor> RevokeExecutor(const std::string& executor_id, absl::Time now) = 0;
  // Lets a pending executor lease: pending -> available, all or nothing. NotFound when unknown;
  // FailedPrecondition when it is not pending. Returns the executor as it is after.
  virtual absl::StatusOr<Executor> ApproveExecutor(const std::string& /*executor_id*/, absl::Time /*now*/) {
    return absl::UnimplementedError("this store cannot approve executors");
  }
  // Exchanges executor `fresh.principal`'s credential `token_id` for `fresh`, all or nothing: the
  // old one must be usable at `now` (CheckUsable: Unauthenticated otherwise) and the executor not
  // revoked (Unauthenticated); `fresh` is stored as the executor's credential with the old one's
  // scopes (its role, scopes and issuer are set here), and the old one then expires at
  // `old_expires_by` at the latest (the grace its calls in flight and other servers' caches need).
  // NotFound for an unknown executor or token; FailedPrecondition when the token is not that
  // executor's credential. `fresh` is completed once stored.
  virtual absl::Status RotateCredential(const std::string& /*token_id*/, TokenRecord& /*fresh*/, absl::Time /*now*/,
                                        absl::Time /*old_expires_by*/) {
    return absl::UnimplementedError("this store cannot rotate credentials");
  }
};

}  // namespace minions

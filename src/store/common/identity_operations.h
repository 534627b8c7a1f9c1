#pragma once
// IdentityOperations: the IdentityStore half of every MetadataStore (store/identity_store.h),
// written once over a RowStore (store/row_store.h): teams, credentials, and the two operations
// that tie credentials to executors (enrolment and revocation), each one transaction applying
// model/identity.h's rules through store/common/store_rules.h.
// Lock order (where rows lock), extending the store's: tasks, then executor, then tokens; a job's
// creation locks its team's row first.
// Borrows the store, the options and the id source. Thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/common/id_generator.h"
#include "store/identity_store.h"
#include "store/metadata_store.h"
#include "store/row_store.h"

namespace minions {

class IdentityOperations {
 public:
  IdentityOperations(RowStore& store, const StoreOptions& options, IdGenerator& ids)
      : store_(store), options_(options), ids_(ids) {}

  absl::StatusOr<Team> CreateTeam(const Team& team);
  absl::StatusOr<Team> UpdateTeam(const Team& team);
  absl::StatusOr<Team> GetTeam(const std::string& name);
  absl::StatusOr<std::vector<Team>> ListTeams();
  absl::StatusOr<Team> ChargeTeamBytes(const std::string& team, TeamBytes kind, int64_t delta, bool enforce);

  absl::Status AddToken(const TokenRecord& token);
  absl::StatusOr<TokenRecord> FindToken(const std::string& secret_hash);
  absl::StatusOr<TokenRecord> GetToken(const std::string& token_id);
  absl::StatusOr<std::vector<TokenRecord>> ListTokens(const TokenFilter& filter);
  absl::StatusOr<TokenRecord> RevokeToken(const std::string& token_id, absl::Time now);
  absl::Status RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at);
  absl::StatusOr<std::vector<std::string>> RevokedTokensSince(absl::Time since);

  absl::StatusOr<Executor> EnrolExecutor(const std::string& join_secret_hash, TokenRecord& credential,
                                         const ExecutorInfo& info, absl::Time now, bool await_approval);
  absl::StatusOr<Executor> RevokeExecutor(const std::string& executor_id, absl::Time now);
  absl::StatusOr<Executor> ApproveExecutor(const std::string& executor_id, absl::Time now);
  absl::Status RotateCredential(const std::string& token_id, TokenRecord& fresh, absl::Time now,
                                absl::Time old_expires_by);

 private:
  RowStore& store_;
  const StoreOptions& options_;
  IdGenerator& ids_;
};

}  // namespace minions

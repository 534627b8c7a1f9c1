#pragma once
// The loads and inserts every MetadataStore operation shares, over a RowTransaction
// (store/row_store.h): one row by its key, with the NotFound message for a missing one said
// once here; an insert under a fresh id. Pure plumbing over the transaction; the thread of the
// transaction.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "store/common/id_generator.h"
#include "store/row_store.h"

namespace minions::row_access {

// NotFound for an unknown job, task, executor: the messages every operation gives.
absl::Status NoJob(const std::string& job_id);
absl::Status NoTask(const std::string& job_id, int64_t index);
absl::Status NoExecutor(const std::string& executor_id);

absl::StatusOr<Job> LoadJob(RowTransaction& t, const std::string& job_id, Locking locking = Locking::kLock);
absl::StatusOr<Executor> LoadExecutor(RowTransaction& t, const std::string& executor_id);
absl::StatusOr<Task> LoadTask(RowTransaction& t, const std::string& job_id, int64_t index);
// The tasks of `keys` that exist, in key order.
absl::StatusOr<std::vector<Task>> LoadTasks(RowTransaction& t, const std::vector<TaskId>& keys,
                                            Locking locking = Locking::kLock);
// Where the time of each executor that holds one of `tasks` (its current attempt or its shadow)
// was last charged (RowTransaction::ChargedUntil), for store_rules EndedAttemptTime; not locked.
absl::StatusOr<std::map<std::string, absl::Time>> ChargedUntilOfHolders(RowTransaction& t,
                                                                        const std::vector<Task>& tasks);
absl::StatusOr<std::optional<Team>> FindTeam(RowTransaction& t, const std::string& name);
// By id (NotFound "no token <id>") or by hash (NotFound "no such token": a hash is never repeated
// in a message, for a lookup it is as good as the token's text).
absl::StatusOr<TokenRecord> LoadToken(RowTransaction& t, const std::string& token_id);
absl::StatusOr<TokenRecord> LoadTokenByHash(RowTransaction& t, const std::string& secret_hash);

// Inserts `job` (or `executor`) under a fresh id of `ids`, trying another when one is taken (4
// tries); sets its id.
absl::Status InsertWithFreshId(RowTransaction& t, IdGenerator& ids, Job& job);
absl::Status InsertWithFreshId(RowTransaction& t, IdGenerator& ids, Executor& executor);

}  // namespace minions::row_access

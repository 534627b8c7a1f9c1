#include "store/common/row_access.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace minions::row_access {
namespace {

// The one row of `rows` under `key`, or `missing`.
template <typename Map>
absl::StatusOr<typename Map::mapped_type> TheOne(Map& rows, const typename Map::key_type& key, absl::Status missing) {
  auto it = rows.find(key);
  if (it == rows.end()) return missing;
  return std::move(it->second);
}

// Inserts `row`, made by `writes` from it, under fresh ids.
template <typename Row>
absl::Status InsertFresh(RowTransaction& t, IdGenerator& ids, const char* prefix, Row& row,
                         RowWrites (*writes)(const Row&)) {
  for (int tries = 0;; ++tries) {
    row.id = ids.NewId(prefix);
    absl::Status inserted = t.Insert(writes(row));
    if (inserted.ok()) return inserted;
    if (!absl::IsAlreadyExists(inserted) || tries == 3) return inserted;
  }
}

}  // namespace

absl::Status NoJob(const std::string& job_id) { return absl::NotFoundError(absl::StrCat("no job ", job_id)); }
absl::Status NoTask(const std::string& job_id, int64_t index) {
  return absl::NotFoundError(absl::StrCat("no task ", job_id, "/", index));
}
absl::Status NoExecutor(const std::string& executor_id) {
  return absl::NotFoundError(absl::StrCat("no executor ", executor_id));
}

absl::StatusOr<Job> LoadJob(RowTransaction& t, const std::string& job_id, Locking locking) {
  ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.jobs = {job_id}}, locking));
  return TheOne(rows.jobs, job_id, NoJob(job_id));
}

absl::StatusOr<Executor> LoadExecutor(RowTransaction& t, const std::string& executor_id) {
  ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.executors = {executor_id}}));
  return TheOne(rows.executors, executor_id, NoExecutor(executor_id));
}

absl::StatusOr<Task> LoadTask(RowTransaction& t, const std::string& job_id, int64_t index) {
  ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.tasks = {{job_id, index}}}));
  return TheOne(rows.tasks, TaskId{job_id, index}, NoTask(job_id, index));
}

absl::StatusOr<std::vector<Task>> LoadTasks(RowTransaction& t, const std::vector<TaskId>& keys, Locking locking) {
  std::vector<Task> tasks;
  if (keys.empty()) return tasks;
  ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.tasks = keys}, locking));
  tasks.reserve(rows.tasks.size());
  for (auto& [key, task] : rows.tasks) tasks.push_back(std::move(task));
  return tasks;
}

absl::StatusOr<std::map<std::string, absl::Time>> ChargedUntilOfHolders(RowTransaction& t,
                                                                        const std::vector<Task>& tasks) {
  std::vector<std::string> holders;
  for (const Task& task : tasks) {
    if (!task.executor_id.empty()) holders.push_back(task.executor_id);
    if (task.shadow) holders.push_back(task.shadow->executor_id);
  }
  return t.ChargedUntil(holders);
}

absl::StatusOr<std::optional<Team>> FindTeam(RowTransaction& t, const std::string& name) {
  ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.teams = {name}}));
  auto it = rows.teams.find(name);
  if (it == rows.teams.end()) return std::optional<Team>();
  return std::optional<Team>(std::move(it->second));
}

absl::StatusOr<TokenRecord> LoadToken(RowTransaction& t, const std::string& token_id) {
  ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.tokens = {token_id}}));
  return TheOne(rows.tokens, token_id, absl::NotFoundError(absl::StrCat("no token ", token_id)));
}

absl::StatusOr<TokenRecord> LoadTokenByHash(RowTransaction& t, const std::string& secret_hash) {
  ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.token_hashes = {secret_hash}}));
  for (auto& [id, token] : rows.tokens) {
    if (token.secret_hash == secret_hash) return std::move(token);
  }
  return absl::NotFoundError("no such token");
}

absl::Status InsertWithFreshId(RowTransaction& t, IdGenerator& ids, Job& job) {
  return InsertFresh<Job>(t, ids, "job-", job, [](const Job& row) { return RowWrites{.jobs = {row}}; });
}

absl::Status InsertWithFreshId(RowTransaction& t, IdGenerator& ids, Executor& executor) {
  return InsertFresh<Executor>(t, ids, "exe-", executor,
                               [](const Executor& row) { return RowWrites{.executors = {row}}; });
}

}  // namespace minions::row_access

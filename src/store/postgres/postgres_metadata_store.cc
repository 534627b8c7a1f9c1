#include "store/postgres/postgres_metadata_store.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/json_codec.h"
#include "store/common/store_rows.h"
#include "store/common/store_rules.h"
#include "store/postgres/pg_connection.h"
#include "store/postgres/postgres_migrations.h"
#include "store/postgres/postgres_statements.h"

namespace minions {
namespace {

using postgres_store::Borrowed;
using postgres_store::CheckConninfo;
using postgres_store::ConnectionPool;
using postgres_store::Params;
using postgres_store::PgResult;
using postgres_store::Row;
namespace sql = postgres_store::sql;
namespace rows = store_rows;
namespace rules = store_rules;

// Counter shards per job: a completion adds to one at random, so that completers of one job
// rarely wait on each other (16: several times the connections one server pool has).
constexpr int kCounterShards = 16;

int RandomShard() {
  static thread_local std::mt19937 random(std::random_device{}());
  return std::uniform_int_distribution<int>(0, kCounterShards - 1)(random);
}

std::string Name(std::string_view name) { return std::string(name); }

}  // namespace

// --- opening and migrations ---

absl::StatusOr<std::unique_ptr<PostgresMetadataStore>> PostgresMetadataStore::Open(const std::string& conninfo,
                                                                                   const StoreOptions& options,
                                                                                   int pool_size) {
  RETURN_IF_ERROR(CheckConninfo(conninfo));
  if (pool_size < 1) return absl::InvalidArgumentError(absl::StrCat("pool size ", pool_size, " < 1"));
  auto pool = std::make_unique<ConnectionPool>(conninfo, pool_size);
  {
    // A server that cannot be reached at all now is an error at once; retrying is for a server
    // that goes away while we use it.
    Borrowed connection(pool.get());
    RETURN_IF_ERROR(connection->EnsureConnected());
  }
  std::unique_ptr<PostgresMetadataStore> store(
      new PostgresMetadataStore(std::move(pool), std::make_unique<ConnectionPool>(conninfo, 1), options));
  RETURN_IF_ERROR(store->Migrate());
  return store;
}

PostgresMetadataStore::PostgresMetadataStore(std::unique_ptr<ConnectionPool> pool,
                                             std::unique_ptr<ConnectionPool> heartbeat_pool,
                                             const StoreOptions& options)
    : options_(options),
      transactions_(std::move(pool), options.clock != nullptr ? options.clock : &real_clock_),
      heartbeat_transactions_(std::move(heartbeat_pool), options.clock != nullptr ? options.clock : &real_clock_),
      random_(std::random_device{}()) {}

PostgresMetadataStore::~PostgresMetadataStore() = default;

absl::Status PostgresMetadataStore::Migrate() {
  const int latest = postgres_store::LatestSchemaVersion();
  // One migration per transaction, each under the advisory lock; the version is read again
  // inside each one, after the lock: another server may have migrated meanwhile.
  while (true) {
    ASSIGN_OR_RETURN(
        bool done, InTransaction(true, [&](Connection& c) -> absl::StatusOr<bool> {
          RETURN_IF_ERROR(c.Exec(sql::kMigrationLock, Params().Int(postgres_store::kMigrationLockKey)).status());
          RETURN_IF_ERROR(c.Exec(sql::kCreateMigrationsTable).status());
          ASSIGN_OR_RETURN(PgResult version, c.Exec(sql::kSchemaVersion));
          const int current = static_cast<int>(version.Int(0, 0));
          if (current > latest) {
            return absl::FailedPreconditionError(
                absl::StrCat("metadata store (PostgreSQL database ", version.Text(0, 1), ", schema ",
                             version.Text(0, 2), ") has schema version ", current, " but this binary knows only up to ",
                             latest, ": it was written by a newer minions; upgrade this binary"));
          }
          if (current == latest) return true;
          const postgres_store::Migration& migration = postgres_store::Migrations()[current];
          if (migration.version != current + 1) {
            return absl::InternalError(absl::StrCat("migration list is out of order at version ", current + 1));
          }
          RETURN_IF_ERROR(c.ExecScript(migration.sql).status());
          RETURN_IF_ERROR(c.Exec(sql::kRecordMigration, Params().Int(migration.version)).status());
          return false;
        }));
    if (done) return absl::OkStatus();
  }
}

absl::StatusOr<int> PostgresMetadataStore::SchemaVersion() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(PgResult version, c.Exec(sql::kSchemaVersion));
    return static_cast<int>(version.Int(0, 0));
  });
}

std::string PostgresMetadataStore::NewId(const char* prefix) {
  uint64_t bits;
  {
    absl::MutexLock lock(&random_mu_);
    bits = random_();
  }
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%012llx", static_cast<unsigned long long>(bits & 0xffffffffffffULL));
  return absl::StrCat(prefix, hex);
}

// --- rows ---

absl::StatusOr<Job> PostgresMetadataStore::LoadJob(Connection& c, const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result,
                   c.Exec(c.for_update() ? sql::kSelectJobForUpdate : sql::kSelectJob, Params().Text(job_id)));
  if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return rows::ReadJob(Row{result, 0});
}

namespace {

absl::StatusOr<std::vector<Job>> ReadJobs(const PgResult& result) {
  std::vector<Job> jobs;
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(Job job, rows::ReadJob(Row{result, i}));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

// A job as committed (or written by this transaction), without locking its row.
absl::StatusOr<Job> ReadJobUnlocked(postgres_store::Connection& c, const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kSelectJob, Params().Text(job_id)));
  if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return rows::ReadJob(Row{result, 0});
}

absl::StatusOr<std::vector<Task>> ReadTasks(const PgResult& result) {
  std::vector<Task> tasks;
  tasks.reserve(result.Rows());
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(Task task, rows::ReadTask(Row{result, i}));
    tasks.push_back(std::move(task));
  }
  return tasks;
}

// The statement that reads tasks by key (in key order), locked when `for_update`.
postgres_store::Connection::Statement TasksByKey(const std::vector<std::pair<std::string, int64_t>>& keys, bool for_update) {
  std::vector<rows::Values> values;
  for (const auto& [job_id, index] : keys) values.push_back({job_id, index});
  return {for_update ? sql::kSelectTasksForUpdate : sql::kSelectTasks, std::move(Params().Columns(values, 2))};
}

// The statement that reads and locks executors by id (in id order: the store's lock order).
postgres_store::Connection::Statement ExecutorsForUpdate(const std::vector<std::string>& ids) {
  std::vector<rows::Values> values;
  for (const std::string& id : ids) values.push_back({id});
  return {sql::kSelectExecutorsForUpdate, std::move(Params().Columns(values, 1))};
}

using ExecutorsById = std::map<std::string, Executor>;

absl::StatusOr<ExecutorsById> ReadExecutorsById(const PgResult& result) {
  ExecutorsById executors;
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(Executor executor, rows::ReadExecutor(Row{result, i}));
    std::string id = executor.id;
    executors.emplace(std::move(id), std::move(executor));
  }
  return executors;
}

Params TaskArrays(const std::vector<Task>& tasks) {
  std::vector<rows::Values> values;
  values.reserve(tasks.size());
  for (const Task& task : tasks) values.push_back(rows::TaskValues(task));
  return std::move(Params().Columns(values, rows::kTaskColumns));
}

}  // namespace

absl::Status PostgresMetadataStore::SaveJob(Connection& c, const Job& job, bool insert) {
  ASSIGN_OR_RETURN(PgResult result,
                   c.Exec(insert ? sql::kInsertJob : sql::kUpdateJob, Params().Values(rows::JobValues(job))));
  if (result.Affected() != 1) {
    if (insert) return absl::AlreadyExistsError(absl::StrCat("job ", job.id, " exists"));
    return absl::NotFoundError(absl::StrCat("no job ", job.id));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::LoadTasks(Connection& c, const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(c.for_update() ? sql::kSelectTasksOfJobForUpdate : sql::kSelectTasksOfJob,
                                           Params().Text(job_id)));
  return ReadTasks(result);
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::LoadTasks(
    Connection& c, const std::vector<std::pair<std::string, int64_t>>& keys) {
  const Connection::Statement select = TasksByKey(keys, c.for_update());
  ASSIGN_OR_RETURN(PgResult result, c.Exec(select.sql, select.params));
  return ReadTasks(result);
}

absl::Status PostgresMetadataStore::SaveTasks(Connection& c, const std::vector<Task>& tasks, bool insert) {
  if (tasks.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(PgResult result, c.Exec(insert ? sql::kInsertTasks : sql::kUpdateTasks, TaskArrays(tasks)));
  if (result.Affected() != static_cast<int64_t>(tasks.size())) {
    return insert ? absl::AlreadyExistsError(absl::StrCat("job ", tasks.front().job_id, ": tasks exist"))
                  : absl::NotFoundError(absl::StrCat("job ", tasks.front().job_id, ": tasks vanished"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Executor> PostgresMetadataStore::LoadExecutor(Connection& c, const std::string& executor_id) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(c.for_update() ? sql::kSelectExecutorForUpdate : sql::kSelectExecutor,
                                           Params().Text(executor_id)));
  if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no executor ", executor_id));
  return rows::ReadExecutor(Row{result, 0});
}

absl::Status PostgresMetadataStore::SaveExecutor(Connection& c, const Executor& executor, bool insert) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(insert ? sql::kInsertExecutor : sql::kUpdateExecutor,
                                           Params().Values(rows::ExecutorValues(executor))));
  if (result.Affected() != 1) {
    if (insert) return absl::AlreadyExistsError(absl::StrCat("executor ", executor.id, " exists"));
    return absl::NotFoundError(absl::StrCat("no executor ", executor.id));
  }
  return absl::OkStatus();
}

// --- ending attempts, counting, settling ---

absl::Status PostgresMetadataStore::WriteAttempts(Connection& c, const AttemptWrites& writes, absl::Time now,
                                                  std::set<std::string>* settle_later) {
  // What the ended tasks add to each job's counts, as a zeroed Job counts them.
  std::map<std::string, Job> added;
  if (writes.counted) added = *writes.counted;
  for (const Task* task : writes.ended) CountTerminalTask(added[task->job_id], *task, now);
  std::vector<rows::Values> charges;
  for (const auto& [job_id, time] : writes.charges) {
    if (time <= absl::ZeroDuration()) continue;
    charges.push_back({job_id, absl::ToInt64Microseconds(time)});
    added[job_id].device_time += time;  // its counter shard's device time (an attempt retried counts too)
  }
  std::vector<rows::Values> counts, device;
  std::vector<rows::Values> job_ids;
  const int shard = RandomShard();
  for (const auto& [job_id, job] : added) {
    counts.push_back({job_id, int64_t{shard}, job.tasks_done, job.tasks_succeeded, job.counts.completed,
                      job.counts.failed, rows::TimeValue(now)});
    device.push_back({absl::ToInt64Microseconds(job.device_time)});
    job_ids.push_back({job_id});
  }
  std::vector<rows::Values> records;
  for (const auto& [executor_id, n] : writes.records) records.push_back({executor_id, n});
  Params params = TaskArrays(writes.tasks);
  params.Columns(counts, 7)
      .Columns(records, 2)
      .Columns(charges, 2)
      .Time(now)
      .Int(absl::ToInt64Microseconds(options_.fair_share_half_life))
      .Columns(device, 1);
  if (settle_later != nullptr && !job_ids.empty()) {
    c.AfterCommit(sql::kFinishedJobs,
                  std::move(Params()
                                .Columns(job_ids, 1)
                                .Text(Name(JobStateName(JobState::kQueued)))
                                .Text(Name(JobStateName(JobState::kRunning)))),
                  [settle_later](const PgResult& finished) {
                    for (int i = 0; i < finished.Rows(); ++i) settle_later->insert(finished.Text(i, 0));
                  });
  }
  return c.ExecAndCommit(sql::kWriteAttempts, params);
}

absl::StatusOr<bool> PostgresMetadataStore::SettleIfDone(Connection& c, const std::string& job_id, absl::Time now) {
  auto unsettled = [](const Job& job) {
    // Only a job whose tasks run: one still validating has none yet.
    return job.tasks_done >= job.n_tasks && (job.state == JobState::kQueued || job.state == JobState::kRunning);
  };
  ASSIGN_OR_RETURN(Job job, ReadJobUnlocked(c, job_id));
  if (!unsettled(job)) return false;
  // Lock it and look again.
  if (!c.for_update()) return absl::InternalError("settling a job outside a writing transaction");
  ASSIGN_OR_RETURN(job, LoadJob(c, job_id));
  if (!unsettled(job)) return false;
  std::string last_error;
  if (job.tasks_succeeded == 0) {
    ASSIGN_OR_RETURN(PgResult failure,
                     c.Exec(sql::kLastFailure, Params().Text(job_id).Text(Name(TaskStateName(TaskState::kFailed)))));
    if (failure.Rows() > 0) last_error = failure.Text(0, 0);
  }
  if (!SettleJob(job, last_error, now)) return false;
  RETURN_IF_ERROR(SaveJob(c, job));
  return job.state == JobState::kFinalizing;
}

std::vector<std::string> PostgresMetadataStore::SettleLater(const std::set<std::string>& job_ids, absl::Time now) {
  std::vector<std::string> finalizing;
  if (job_ids.empty()) return finalizing;
  absl::Status settled = InTransaction(true, [&](Connection& c) -> absl::Status {
    finalizing.clear();
    for (const std::string& job_id : job_ids) {
      ASSIGN_OR_RETURN(bool ready, SettleIfDone(c, job_id, now));
      if (ready) finalizing.push_back(job_id);
    }
    return absl::OkStatus();
  });
  if (!settled.ok()) finalizing.clear();  // nothing of it was written: the sweep settles them
  return finalizing;
}

template <typename Transition>
absl::StatusOr<std::vector<absl::StatusOr<std::vector<absl::Status>>>> PostgresMetadataStore::FinishAttempts(
    Connection& c, const std::vector<CompletionCall>& calls, Transition&& transition, absl::Time now,
    std::vector<Task>* finished, std::set<std::string>& settle_later) {
  // The reported tasks are locked in key order, in one statement; then (for several calls) the
  // executors, in id order.
  std::vector<std::pair<std::string, int64_t>> keys;
  for (const CompletionCall& call : calls) {
    for (const LeaseProgress& report : call.reports) keys.emplace_back(report.job_id, report.task_index);
  }
  std::set<std::string> known;  // the calls' executors that exist
  std::map<std::pair<std::string, int64_t>, Task> tasks;
  if (calls.size() == 1) {
    // One executor: whether it exists, and its tasks, in one round trip.
    std::vector<rows::Values> key_values;
    for (const auto& [job_id, index] : keys) key_values.push_back({job_id, index});
    ASSIGN_OR_RETURN(PgResult loaded, c.Exec(sql::kExecutorAndTasksForUpdate,
                                             std::move(Params().Columns(key_values, 2).Text(calls[0].executor_id))));
    if (loaded.Rows() > 0 && loaded.Int(0, 0) > 0) known.insert(calls[0].executor_id);
    for (int i = 0; i < loaded.Rows(); ++i) {
      if (loaded.IsNull(i, 1)) continue;
      ASSIGN_OR_RETURN(Task task, rows::ReadTask(Row{loaded, i}, 1));
      tasks.emplace(std::make_pair(task.job_id, task.index), std::move(task));
    }
  } else if (!calls.empty()) {
    if (!keys.empty()) {
      ASSIGN_OR_RETURN(std::vector<Task> loaded, LoadTasks(c, keys));
      for (Task& task : loaded) tasks.emplace(std::make_pair(task.job_id, task.index), std::move(task));
    }
    std::vector<rows::Values> id_values;
    for (const CompletionCall& call : calls) id_values.push_back({call.executor_id});
    ASSIGN_OR_RETURN(PgResult ids, c.Exec(sql::kExecutorIdsForUpdate, Params().Columns(id_values, 1)));
    for (int i = 0; i < ids.Rows(); ++i) known.insert(ids.Text(i, 0));
  }

  AttemptWrites writes;
  std::vector<std::string> writers;  // the executor of each of writes.tasks
  std::vector<absl::StatusOr<std::vector<absl::Status>>> answers;
  std::vector<size_t> written;  // index in writes.tasks of each report's task, or npos
  for (const CompletionCall& call : calls) {
    if (!known.contains(call.executor_id)) {
      answers.push_back(absl::NotFoundError(absl::StrCat("no executor ", call.executor_id)));
      written.insert(written.end(), call.reports.size(), std::string::npos);
      continue;
    }
    std::vector<absl::Status> outcomes;
    for (const LeaseProgress& report : call.reports) {
      auto it = tasks.find(std::make_pair(report.job_id, report.task_index));
      if (it == tasks.end()) {
        outcomes.push_back(absl::NotFoundError(absl::StrCat("no task ", report.job_id, "/", report.task_index)));
        written.push_back(std::string::npos);
        continue;
      }
      Task updated = it->second;  // as loaded: a refused report leaves the row as it is
      absl::Status fence = CheckFence(updated, call.executor_id, report.attempt);
      if (fence.ok()) fence = transition(updated, report);
      outcomes.push_back(fence);
      if (!fence.ok()) {
        written.push_back(std::string::npos);
        continue;
      }
      writes.charges[updated.job_id] += rules::EndedAttemptTime(it->second, updated, now);
      it->second = updated;  // a second report of the same attempt is then refused
      written.push_back(writes.tasks.size());
      writes.tasks.push_back(std::move(updated));
      writers.push_back(call.executor_id);
    }
    answers.push_back(std::move(outcomes));
  }
  // One row per task written: a task reported twice in the batch is written as it ended last.
  {
    std::map<std::pair<std::string, int64_t>, size_t> last;
    for (size_t i = 0; i < writes.tasks.size(); ++i) last[{writes.tasks[i].job_id, writes.tasks[i].index}] = i;
    if (last.size() != writes.tasks.size()) {
      return absl::InternalError("a task ended twice in one batch of completions");
    }
  }
  for (size_t i = 0; i < writes.tasks.size(); ++i) {
    const Task& task = writes.tasks[i];
    if (IsTerminal(task.state)) {
      writes.ended.push_back(&task);
      if (task.state == TaskState::kSucceeded) writes.records[writers[i]] += task.records_done;
    }
  }
  RETURN_IF_ERROR(WriteAttempts(c, writes, now, &settle_later));
  if (finished != nullptr) {
    for (size_t i : written) finished->push_back(i == std::string::npos ? Task{} : writes.tasks[i]);
  }
  return answers;
}

// --- jobs ---

absl::StatusOr<Job> PostgresMetadataStore::CreateJob(const JobSpec& spec, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Job> {
    // The team's row, locked, serialises its submissions, so its quota cannot be overrun by
    // several at once.
    ASSIGN_OR_RETURN(std::optional<Team> team, LoadTeam(c, spec.team));
    ASSIGN_OR_RETURN(PgResult active, c.Exec(sql::kCountActiveJobs, Params().Text(spec.team)));
    RETURN_IF_ERROR(rules::CheckJobQuota(team, active.Int(0, 0)));
    Job job = rules::NewJob(spec, now);
    // 48 random bits: a collision is unlikely, and retried when it happens.
    for (int tries = 0;; ++tries) {
      job.id = NewId("job-");
      absl::Status inserted = SaveJob(c, job, /*insert=*/true);
      if (inserted.ok()) return job;
      if (!absl::IsAlreadyExists(inserted) || tries == 3) return inserted;
    }
  });
}

absl::Status PostgresMetadataStore::AddTasks(const std::string& job_id, const std::vector<Task>& tasks,
                                             int64_t total_records, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
    ASSIGN_OR_RETURN(std::vector<Task> fresh, rules::AddTasksToJob(job, tasks, total_records, now));
    RETURN_IF_ERROR(SaveTasks(c, fresh, /*insert=*/true));
    return SaveJob(c, job);
  });
}

absl::StatusOr<Job> PostgresMetadataStore::GetJob(const std::string& job_id) {
  return InTransaction(false, [&](Connection& c) { return LoadJob(c, job_id); });
}

absl::StatusOr<std::vector<Job>> PostgresMetadataStore::ListJobs(const JobFilter& filter) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Job>> {
    Params params;
    if (filter.state) {
      params.Text(Name(JobStateName(*filter.state)));
    } else {
      params.Null();
    }
    params.Text(filter.team).Limit(filter.limit);
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kListJobs, params));
    return ReadJobs(result);
  });
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::ListTasks(const std::string& job_id) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Task>> {
    RETURN_IF_ERROR(LoadJob(c, job_id).status());
    return LoadTasks(c, job_id);
  });
}

absl::StatusOr<Task> PostgresMetadataStore::GetTask(const std::string& job_id, int64_t task_index) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<Task> {
    ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(c, {{job_id, task_index}}));
    if (tasks.empty()) return absl::NotFoundError(absl::StrCat("no task ", job_id, "/", task_index));
    return std::move(tasks.front());
  });
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::GetTasks(
    const std::vector<std::pair<std::string, int64_t>>& keys) {
  if (keys.empty()) return std::vector<Task>{};
  return InTransaction(false, [&](Connection& c) { return LoadTasks(c, keys); });
}

absl::StatusOr<TaskStateCounts> PostgresMetadataStore::CountTasks(const std::string& job_id) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<TaskStateCounts> {
    ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kCountTasks, Params().Text(job_id)));
    TaskStateCounts counts;
    counts.done = job.tasks_done;
    counts.succeeded = job.tasks_succeeded;
    counts.pending = result.Int(0, 0);
    counts.running = result.Int(0, 1);
    counts.executors = result.Int(0, 2);
    counts.records_in_flight = result.Int(0, 3);
    return counts;
  });
}

absl::StatusOr<bool> PostgresMetadataStore::AnyTaskPending() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<bool> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kAnyTaskPending, Params()));
    return result.Bool(0, 0);
  });
}

absl::StatusOr<Job> PostgresMetadataStore::EndJob(Connection& c, const std::string& job_id, JobState state,
                                                  const std::string& error, absl::Time now) {
  // The store's lock order is tasks, then their job: lock the tasks first, then read them again
  // once the job is locked (AddTasks may have committed in between).
  RETURN_IF_ERROR(LoadTasks(c, job_id).status());
  ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
  ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(c, job_id));
  std::map<int64_t, Task> before;
  for (const Task& task : tasks) before[task.index] = task;
  ASSIGN_OR_RETURN(std::vector<Task> cancelled, rules::EndJob(job, state, error, tasks, now));
  RETURN_IF_ERROR(SaveJob(c, job));
  AttemptWrites writes;
  writes.tasks = std::move(cancelled);
  for (const Task& task : writes.tasks) {
    writes.ended.push_back(&task);
    // The attempts it stopped used their machines until now: charged to the team like any other.
    writes.charges[job_id] += rules::EndedAttemptTime(before[task.index], task, now);
  }
  RETURN_IF_ERROR(WriteAttempts(c, writes, now, /*settle_later=*/nullptr));  // it has ended: nothing to settle
  job.device_time += rules::DeviceTime(writes.charges[job_id], job.spec);  // (read before the charge)
  return job;
}

absl::StatusOr<Job> PostgresMetadataStore::CancelJob(const std::string& job_id, absl::Time now) {
  return InTransaction(true, [&](Connection& c) { return EndJob(c, job_id, JobState::kCancelled, "", now); });
}

absl::StatusOr<Job> PostgresMetadataStore::FailJob(const std::string& job_id, const std::string& error,
                                                   absl::Time now) {
  return InTransaction(true, [&](Connection& c) { return EndJob(c, job_id, JobState::kFailed, error, now); });
}

absl::StatusOr<Job> PostgresMetadataStore::ExpireJob(const std::string& job_id, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Job> {
    // Lock order: the tasks, then their job (as EndJob).
    RETURN_IF_ERROR(LoadTasks(c, job_id).status());
    ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
    ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(c, job_id));
    const Job before = job;
    std::vector<Task> was = tasks;
    RETURN_IF_ERROR(::minions::ExpireJob(job, tasks, now));
    RETURN_IF_ERROR(SaveJob(c, job));
    // The counts live in counter rows: add what the expiry counted.
    AttemptWrites writes;
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].state == was[i].state) continue;
      writes.tasks.push_back(tasks[i]);
      // The attempts it stopped used their machines until now, as a cancel's do.
      writes.charges[job_id] += rules::EndedAttemptTime(was[i], tasks[i], now);
    }
    Job delta;
    delta.tasks_done = job.tasks_done - before.tasks_done;
    delta.tasks_succeeded = job.tasks_succeeded - before.tasks_succeeded;
    delta.counts.completed = job.counts.completed - before.counts.completed;
    delta.counts.failed = job.counts.failed - before.counts.failed;
    writes.counted.emplace();
    if (delta.tasks_done > 0) (*writes.counted)[job_id] = delta;
    RETURN_IF_ERROR(WriteAttempts(c, writes, now, /*settle_later=*/nullptr));  // it is finalizing already
    job.device_time += rules::DeviceTime(writes.charges[job_id], job.spec);  // (read before the charge)
    return job;
  });
}

absl::StatusOr<Task> PostgresMetadataStore::RequestBackup(const std::string& job_id, int64_t task_index, int attempt,
                                                          absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Task> {
    ASSIGN_OR_RETURN(std::vector<Task> tasks,
                     LoadTasks(c, std::vector<std::pair<std::string, int64_t>>{{job_id, task_index}}));
    if (tasks.empty()) return absl::NotFoundError(absl::StrCat("no task ", job_id, "/", task_index));
    Task& task = tasks[0];
    if (task.attempt != attempt) {
      return absl::FailedPreconditionError(absl::StrCat("task ", job_id, "/", task_index, " is on attempt ",
                                                        task.attempt, ", not ", attempt));
    }
    const Task before = task;
    RETURN_IF_ERROR(::minions::RequestBackup(task, now));
    // The straggler's time so far is charged now (the rest only if it wins); nothing ends.
    AttemptWrites writes;
    writes.tasks = tasks;
    writes.charges[job_id] = rules::EndedAttemptTime(before, task, now);
    RETURN_IF_ERROR(WriteAttempts(c, writes, now, /*settle_later=*/nullptr));
    return writes.tasks[0];
  });
}

absl::StatusOr<std::vector<Job>> PostgresMetadataStore::JobsToFinalize(int limit, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<Job>> {
    // First the sweep: jobs whose last tasks ended in transactions that could not see each other
    // and whose settling after the commit did not happen (the server died in between). Read
    // without locks; SettleIfDone locks each and looks again.
    ASSIGN_OR_RETURN(PgResult unsettled, c.Exec(sql::kUnsettledJobs, Params()
                                                                         .Text(Name(JobStateName(JobState::kQueued)))
                                                                         .Text(Name(JobStateName(JobState::kRunning)))));
    for (int i = 0; i < unsettled.Rows(); ++i) RETURN_IF_ERROR(SettleIfDone(c, unsettled.Text(i, 0), now).status());
    ASSIGN_OR_RETURN(PgResult result,
                     c.Exec(sql::kJobsInState, Params().Text(Name(JobStateName(JobState::kFinalizing))).Limit(limit)));
    return ReadJobs(result);
  });
}

absl::StatusOr<Job> PostgresMetadataStore::FinishJob(const std::string& job_id, const std::string& output_key,
                                                     const std::string& errors_key, const std::string& manifest_key,
                                                     absl::Time now, JobState outcome, const TokenUsage& tokens) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Job> {
    ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
    RETURN_IF_ERROR(rules::FinishJob(job, output_key, errors_key, manifest_key, now, outcome, tokens));
    RETURN_IF_ERROR(SaveJob(c, job));
    RETURN_IF_ERROR(
        c.Exec(sql::kSetJobTokens, Params().Text(job_id).Int(tokens.prompt_tokens).Int(tokens.completion_tokens))
            .status());
    return job;
  });
}

// --- executors ---

absl::StatusOr<Executor> PostgresMetadataStore::RegisterExecutor(const std::string& executor_id,
                                                                 const ExecutorInfo& info, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Executor> {
    Executor executor;
    bool exists = false;
    if (!executor_id.empty()) {
      absl::StatusOr<Executor> loaded = LoadExecutor(c, executor_id);
      if (loaded.ok()) {
        executor = std::move(*loaded);
        exists = true;
      } else if (!absl::IsNotFound(loaded.status())) {
        return loaded.status();
      } else {
        executor.id = executor_id;  // known to the executor, not (or no longer) to this store
      }
    }
    rules::RegisterExecutor(executor, exists, info, now);
    if (exists || !executor.id.empty()) {
      RETURN_IF_ERROR(SaveExecutor(c, executor, /*insert=*/!exists));
      return executor;
    }
    for (int tries = 0;; ++tries) {
      executor.id = NewId("exe-");
      absl::Status inserted = SaveExecutor(c, executor, /*insert=*/true);
      if (inserted.ok()) return executor;
      if (!absl::IsAlreadyExists(inserted) || tries == 3) return inserted;
    }
  });
}

absl::StatusOr<Executor> PostgresMetadataStore::GetExecutor(const std::string& executor_id) {
  return InTransaction(false, [&](Connection& c) { return LoadExecutor(c, executor_id); });
}

absl::StatusOr<std::vector<Executor>> PostgresMetadataStore::ListExecutors() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Executor>> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kListExecutors));
    std::vector<Executor> executors;
    for (int i = 0; i < result.Rows(); ++i) {
      ASSIGN_OR_RETURN(Executor executor, rows::ReadExecutor(Row{result, i}));
      executors.push_back(std::move(executor));
    }
    return executors;
  });
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::ListRunningTasks() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Task>> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kRunningTasks));
    return ReadTasks(result);
  });
}

absl::StatusOr<HeartbeatReply> PostgresMetadataStore::Heartbeat(const std::string& executor_id, ExecutorState state,
                                                                const std::string& reason,
                                                                const std::vector<LeaseProgress>& held,
                                                                absl::Duration ttl, absl::Time now,
    const std::optional<ModelHoldings>& holdings) {
  ASSIGN_OR_RETURN(std::vector<HeartbeatReply> replies,
                   Heartbeats({HeartbeatCall{executor_id, state, reason, held, holdings}}, ttl, now));
  return std::move(replies.front());
}

absl::StatusOr<std::vector<HeartbeatReply>> PostgresMetadataStore::Heartbeats(const std::vector<HeartbeatCall>& calls,
                                                                             absl::Duration ttl, absl::Time now) {
  if (calls.empty()) return std::vector<HeartbeatReply>{};
  return heartbeat_transactions_.InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<HeartbeatReply>> {
    // Every task of the batch before every executor, each in key order: the lock order of
    // completions, which also lock both (so batches and completions cannot deadlock).
    std::vector<std::pair<std::string, int64_t>> keys;
    std::vector<std::string> ids;
    for (const HeartbeatCall& call : calls) {
      ids.push_back(call.executor_id);
      for (const LeaseProgress& progress : call.held) keys.emplace_back(progress.job_id, progress.task_index);
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    // Both loads in one round trip with the BEGIN, and both writes in one with the COMMIT: two
    // round trips a batch (were five). Each round trip waits for the database's process and then
    // this thread to be scheduled, which is what a batch waits on when the cores are busy.
    std::vector<Connection::Statement> loads;
    if (!keys.empty()) loads.push_back(TasksByKey(keys, /*for_update=*/true));
    loads.push_back(ExecutorsForUpdate(ids));
    ASSIGN_OR_RETURN(std::vector<PgResult> loaded, c.ExecEach(loads));
    std::map<std::pair<std::string, int64_t>, Task> tasks;
    if (!keys.empty()) {
      ASSIGN_OR_RETURN(std::vector<Task> read, ReadTasks(loaded.front()));
      for (Task& task : read) tasks.emplace(std::make_pair(task.job_id, task.index), std::move(task));
    }
    ASSIGN_OR_RETURN(ExecutorsById executors, ReadExecutorsById(loaded.back()));
    std::vector<HeartbeatReply> replies;
    std::set<std::pair<std::string, int64_t>> renewed_keys;
    std::set<std::string> seen;
    for (const HeartbeatCall& call : calls) {
      HeartbeatReply& reply = replies.emplace_back();
      auto executor = executors.find(call.executor_id);
      if (executor == executors.end()) {
        // Its leases are left alone: it registers again (same id) and heartbeats them then.
        reply.unknown_executor = true;
        continue;
      }
      if (rules::HeardSince(executor->second, call.unless_heard_since)) {
        reply.drain = executor->second.drain_requested;  // heard since: nothing to write
        continue;
      }
      seen.insert(call.executor_id);
      rules::RecordHeartbeat(executor->second, call.state, call.reason, now, call.holdings);
      for (const LeaseProgress& progress : call.held) {
        auto key = std::make_pair(progress.job_id, progress.task_index);
        auto it = tasks.find(key);
        if (it == tasks.end() || !rules::RenewLease(it->second, call.executor_id, progress, ttl, now)) {
          reply.cancel.push_back(progress);
          continue;
        }
        renewed_keys.insert(key);
        reply.renewed.push_back(progress);
      }
      reply.drain = executor->second.drain_requested;
    }
    std::vector<Task> renewed;
    for (const auto& key : renewed_keys) renewed.push_back(tasks.at(key));
    std::vector<Connection::Statement> writes;
    std::vector<int64_t> expected;  // rows each write must touch: all of them are locked above
    if (!renewed.empty()) {
      writes.push_back({sql::kUpdateTasks, TaskArrays(renewed)});
      expected.push_back(static_cast<int64_t>(renewed.size()));
    }
    if (!seen.empty()) {
      std::vector<rows::Values> values;
      for (const std::string& id : seen) values.push_back(rows::ExecutorValues(executors.at(id)));
      writes.push_back({sql::kUpdateExecutors, Params().Columns(values, 8)});
      expected.push_back(static_cast<int64_t>(values.size()));
    }
    if (writes.empty()) return replies;  // the runner commits (nothing written, locks let go)
    ASSIGN_OR_RETURN(std::vector<PgResult> written, c.ExecEachAndCommit(writes));
    // An assertion more than a check: the rows are locked above, and the batch has committed by
    // now (before the writes went with the COMMIT, it rolled back on this).
    for (size_t i = 0; i < written.size(); ++i) {  // empty when the answers were lost
      if (written[i].Affected() != expected[i]) {
        return absl::InternalError("tasks or executors vanished under a batch of heartbeats");
      }
    }
    return replies;
  });
}

absl::Status PostgresMetadataStore::RequestDrain(const std::string& executor_id, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(c, executor_id));
    rules::RequestDrain(executor);
    return SaveExecutor(c, executor);
  });
}

// --- leasing ---

absl::StatusOr<std::vector<TeamUsage>> PostgresMetadataStore::LoadTeamUsage(Connection& c, absl::Time now) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kTeamUsage, Params().Time(now)));
  std::vector<TeamUsage> teams;
  for (int i = 0; i < result.Rows(); ++i) {
    teams.push_back(rows::ReadTeamUsage(Row{result, i}, now, options_.fair_share_half_life));
  }
  return teams;
}

absl::StatusOr<std::vector<TeamUsage>> PostgresMetadataStore::ListTeamUsage(absl::Time now) {
  return InTransaction(false, [&](Connection& c) { return LoadTeamUsage(c, now); });
}

absl::StatusOr<std::vector<Lease>> PostgresMetadataStore::LeaseTasks(const std::string& executor_id, int max_tasks,
                                                                     absl::Duration ttl, absl::Time now) {
  ASSIGN_OR_RETURN(auto answers, LeaseMany({LeaseAsk{executor_id, max_tasks}}, ttl, now));
  if (answers.size() != 1) return absl::InternalError("the store answered no lease");
  return std::move(answers.front());
}

absl::StatusOr<std::vector<absl::StatusOr<std::vector<Lease>>>> PostgresMetadataStore::LeaseMany(
    const std::vector<LeaseAsk>& asks, absl::Duration ttl, absl::Time now) {
  using Answers = std::vector<absl::StatusOr<std::vector<Lease>>>;
  if (asks.empty()) return Answers{};
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Answers> {
    // The store's lock order: the executors (in id order), then tasks (skipped when another
    // transaction holds them, never waited for), then the teams with a quota, then the jobs that
    // start.
    std::vector<std::string> ids;
    for (const LeaseAsk& ask : asks) ids.push_back(ask.executor_id);
    const Connection::Statement select = ExecutorsForUpdate(ids);
    ASSIGN_OR_RETURN(PgResult selected, c.Exec(select.sql, select.params));
    ASSIGN_OR_RETURN(ExecutorsById executors, ReadExecutorsById(selected));
    ASSIGN_OR_RETURN(std::vector<TeamUsage> teams, LoadTeamUsage(c, now));
    // Teams with a running-task quota: their counts again, under lock (in name order, before any
    // other team's row: concurrent leases cannot overshoot a quota, nor lock teams crosswise).
    std::set<std::string> teams_locked;
    {
      std::vector<rows::Values> quota_teams;
      for (const auto& [team, allowance] : rules::RunningAllowances(teams)) quota_teams.push_back({team});
      if (!quota_teams.empty()) {
        ASSIGN_OR_RETURN(PgResult running,
                         c.Exec(sql::kTeamsRunningForUpdate, std::move(Params().Columns(quota_teams, 1))));
        for (int i = 0; i < running.Rows(); ++i) {
          const std::string team = running.Text(i, 0);
          for (TeamUsage& t : teams) {
            if (t.team == team) t.running = running.Int(i, 1);
          }
        }
        for (const rows::Values& team : quota_teams) teams_locked.insert(std::get<std::string>(team[0]));
      }
    }
    // This batch's grants so far: each later ask sees them as it would see them committed.
    std::map<std::string, int64_t> granted_by_team;
    std::set<std::pair<std::string, int64_t>> granted_keys;
    std::map<std::string, Job> jobs;     // what placement reads of each job (spec, submission), parsed once
    std::set<std::string> unstarted;     // of those, jobs not started yet
    std::set<std::string> to_start;      // jobs this batch starts
    std::set<std::string> busy;          // executors this batch marks busy
    std::vector<Task> granted;
    Answers answers;
    for (const LeaseAsk& ask : asks) {
      auto found = executors.find(ask.executor_id);
      if (found == executors.end()) {
        answers.push_back(absl::NotFoundError(absl::StrCat("no executor ", ask.executor_id)));
        continue;
      }
      Executor& executor = found->second;
      std::vector<Lease> leases;
      if (!rules::MayLease(executor, ask.max_tasks)) {
        answers.push_back(std::move(leases));
        continue;
      }
      // Tasks this batch granted are still pending in the table (written at the end) and locked
      // by this transaction, so they come back: ask for that many more, and pass them over.
      const int64_t limit = ask.max_tasks + static_cast<int64_t>(granted.size());
      ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kLeaseCandidates, Params()
                                                                     .Time(now)
                                                                     .Text(Name(JobStateName(JobState::kQueued)))
                                                                     .Text(Name(JobStateName(JobState::kRunning)))
                                                                     .Int(UsableMemory(executor.info))
                                                                     .Text(DumpJson(Json(rules::RunnersOf(executor))))
                                                                     .Int(limit)
                                                                     .Text(rules::FairShareRanksJson(teams))
                                                                     .Text(executor.info.model_loaded)
                                                                     .Text(DumpJson(Json(executor.info.models)))
                                                                     .Time(now - WarmWait())
                                                                     .Int(options_.model_affinity ? 1 : 0)));
      std::map<std::string, int64_t> allowances = rules::RunningAllowances(teams);
      // The rows the same lease alone would have read: its first max_tasks, the earlier asks'
      // grants left out (a row the rules refuse still counts, as it would alone).
      int considered = 0;
      for (int i = 0; i < result.Rows() && considered < ask.max_tasks; ++i) {
        const Row row{result, i};
        ASSIGN_OR_RETURN(Task task, rows::ReadTask(row));
        if (granted_keys.count({task.job_id, task.index}) > 0) continue;  // an earlier ask's
        ++considered;
        if (jobs.count(task.job_id) == 0) {
          Job job;
          job.id = task.job_id;
          ASSIGN_OR_RETURN(job.spec, rows::JobSpecOf(task.job_id, row.Text(rows::kTaskColumns)));
          job.created_at = row.Time(rows::kTaskColumns + 4);
          jobs.emplace(task.job_id, std::move(job));
          if (row.Text(rows::kTaskColumns + 1) == JobStateName(JobState::kQueued) || !row.Bool(rows::kTaskColumns + 2)) {
            unstarted.insert(task.job_id);
          }
        }
        if (!rules::MayPlace(executor, jobs.at(task.job_id), now, WarmWait())) continue;  // the rules decide
        if (task.shadow && task.shadow->executor_id == ask.executor_id) continue;  // its backup goes elsewhere
        const std::string team = row.Text(rows::kTaskColumns + 3);
        if (!rules::TakeAllowance(allowances, team)) continue;  // team at its quota
        RETURN_IF_ERROR(GrantTask(task, ask.executor_id, ttl, now));
        if (unstarted.count(task.job_id) > 0) to_start.insert(task.job_id);
        granted_keys.insert({task.job_id, task.index});
        ++granted_by_team[team];
        auto standing = std::find_if(teams.begin(), teams.end(), [&](const TeamUsage& t) { return t.team == team; });
        if (standing == teams.end()) {
          standing = teams.insert(teams.end(), TeamUsage{.team = team});  // as the trigger's row would be
        }
        ++standing->running;
        granted.push_back(task);
        leases.push_back(MakeLease(std::move(task), jobs.at(granted.back().job_id).spec));
      }
      if (!leases.empty() && rules::MarkBusy(executor)) busy.insert(ask.executor_id);
      answers.push_back(std::move(leases));
    }
    // Only a job that starts with this batch is locked and written (after its tasks, the store's
    // lock order); every lease of a running job would queue on its row otherwise.
    for (const std::string& job_id : to_start) {
      ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
      if (MarkJobStarted(job, now)) RETURN_IF_ERROR(SaveJob(c, job));
    }
    if (!busy.empty()) {
      std::vector<rows::Values> values;
      for (const std::string& id : busy) values.push_back(rows::ExecutorValues(executors.at(id)));
      ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kUpdateExecutors, Params().Columns(values, 8)));
      if (result.Affected() != static_cast<int64_t>(values.size())) {
        return absl::InternalError("executors vanished under a batch of leases");
      }
    }
    // The grants' teams' rows, which the tasks' trigger updates, locked first in name order: the
    // trigger takes them in the order the update meets the tasks.
    std::vector<rows::Values> unlocked;
    for (const auto& [team, n] : granted_by_team) {
      if (teams_locked.count(team) == 0) unlocked.push_back({team});
    }
    if (unlocked.size() > 1) {
      RETURN_IF_ERROR(c.Exec(sql::kTeamsRunningForUpdate, std::move(Params().Columns(unlocked, 1))).status());
    }
    // The grants last, sent with the COMMIT.
    if (!granted.empty()) RETURN_IF_ERROR(c.ExecAndCommit(sql::kUpdateTasks, TaskArrays(granted)));
    return answers;
  });
}

absl::StatusOr<Task> PostgresMetadataStore::CompleteTask(const std::string& executor_id, const std::string& job_id,
                                                         int64_t task_index, int attempt, int64_t records_done,
                                                         int64_t records_failed, absl::Time now) {
  std::set<std::string> settle_later;
  absl::StatusOr<Task> task = InTransaction(true, [&](Connection& c) -> absl::StatusOr<Task> {
    settle_later.clear();
    std::vector<Task> finished;
    ASSIGN_OR_RETURN(auto answers,
                     FinishAttempts(
                         c, {CompletionCall{executor_id, {{job_id, task_index, attempt, records_done, records_failed}}}},
                         [&](Task& t, const LeaseProgress&) {
                           return ::minions::CompleteTask(t, records_done, records_failed, now);
                         },
                         now, &finished, settle_later));
    ASSIGN_OR_RETURN(std::vector<absl::Status> outcomes, std::move(answers.front()));
    RETURN_IF_ERROR(outcomes.front());
    return finished.front();
  });
  if (task.ok()) SettleLater(settle_later, now);
  return task;
}

absl::StatusOr<CompletionReply> PostgresMetadataStore::CompleteMany(const std::vector<CompletionCall>& calls,
                                                                     absl::Time now) {
  if (calls.empty()) return CompletionReply{};
  std::set<std::string> settle_later;
  CompletionReply reply;
  absl::Status written = InTransaction(true, [&](Connection& c) -> absl::Status {
    settle_later.clear();
    ASSIGN_OR_RETURN(reply.outcomes, FinishAttempts(
                                         c, calls,
                                         [&](Task& t, const LeaseProgress& report) {
                                           return ::minions::CompleteTask(t, report, now);
                                         },
                                         now, nullptr, settle_later));
    return absl::OkStatus();
  });
  RETURN_IF_ERROR(written);
  reply.finalizing = SettleLater(settle_later, now);
  return reply;
}

absl::StatusOr<Task> PostgresMetadataStore::FailTask(const std::string& executor_id, const std::string& job_id,
                                                     int64_t task_index, int attempt, FailureClass failure,
                                                     const std::string& message, absl::Time now,
                                                     const std::vector<Chunk>& chunks) {
  std::set<std::string> settle_later;
  absl::StatusOr<Task> task = InTransaction(true, [&](Connection& c) -> absl::StatusOr<Task> {
    settle_later.clear();
    // The job is only read (for max_attempts): its row is not what this writes.
    absl::StatusOr<Job> job = ReadJobUnlocked(c, job_id);
    if (!job.ok() && !absl::IsNotFound(job.status())) return job.status();
    std::vector<Task> finished;
    ASSIGN_OR_RETURN(auto answers,
                     FinishAttempts(
                         c, {CompletionCall{executor_id, {{job_id, task_index, attempt, 0, 0}}}},
                         [&](Task& t, const LeaseProgress&) -> absl::Status {
                           if (!job.ok()) return job.status();
                           return FailAttempt(t, attempt, chunks, failure, message, job->spec.max_attempts,
                                              options_.retry, now);
                         },
                         now, &finished, settle_later));
    ASSIGN_OR_RETURN(std::vector<absl::Status> outcomes, std::move(answers.front()));
    RETURN_IF_ERROR(outcomes.front());
    return finished.front();
  });
  if (task.ok()) SettleLater(settle_later, now);
  return task;
}

// --- watchdog ---

// --- the servers' agreement ---

absl::Status PostgresMetadataStore::ClaimObjectStore(const std::string& identity, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    RETURN_IF_ERROR(
        c.Exec(sql::kInsertSetting, Params().Text(kObjectStoreSetting).Text(identity).Time(now)).status());
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kSelectSetting, Params().Text(kObjectStoreSetting)));
    return CheckObjectStore(result.Rows() > 0 ? result.Text(0, 0) : "", identity);
  });
}

absl::StatusOr<std::string> PostgresMetadataStore::RecordedObjectStore() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kSelectSetting, Params().Text(kObjectStoreSetting)));
    return result.Rows() > 0 ? result.Text(0, 0) : std::string();
  });
}

absl::Status PostgresMetadataStore::RecordThroughput(const ThroughputKey& key, const ThroughputSample& sample,
                                                     absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    return c
        .Exec(sql::kRecordThroughput, Params()
                                          .Text(key.model)
                                          .Text(key.runner)
                                          .Text(absl::StrCat(sample.records))
                                          .Text(absl::StrFormat("%.9g", absl::ToDoubleSeconds(sample.took)))
                                          .Time(now)
                                          .Text(absl::StrFormat("%.9g", kThroughputMemory)))
        .status();
  });
}

absl::StatusOr<std::optional<Throughput>> PostgresMetadataStore::GetThroughput(const ThroughputKey& key) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::optional<Throughput>> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kSelectThroughput, Params().Text(key.model).Text(key.runner)));
    if (result.Rows() == 0) return std::optional<Throughput>();
    Throughput throughput;
    if (!absl::SimpleAtod(result.Text(0, 0), &throughput.records) ||
        !absl::SimpleAtod(result.Text(0, 1), &throughput.seconds)) {
      return absl::DataLossError(absl::StrCat("task_throughput of ", key.model, " holds no number"));
    }
    throughput.samples = result.Int(0, 2);
    throughput.updated_at = result.Time(0, 3);
    return std::optional<Throughput>(throughput);
  });
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::ExpireLeases(absl::Time now, int limit) {
  std::set<std::string> settle_later;
  absl::StatusOr<std::vector<Task>> expired =
      InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<Task>> {
        settle_later.clear();
        ASSIGN_OR_RETURN(
            PgResult result,
            c.Exec(sql::kExpiredLeases, Params().Time(now).Limit(limit)));
        AttemptWrites writes;
        ASSIGN_OR_RETURN(writes.tasks, ReadTasks(result));
        std::map<std::string, Job> jobs;  // read for max_attempts, not locked: their rows are not written
        for (Task& task : writes.tasks) {
          auto job = jobs.find(task.job_id);
          if (job == jobs.end()) {
            ASSIGN_OR_RETURN(Job loaded, ReadJobUnlocked(c, task.job_id));
            job = jobs.emplace(task.job_id, std::move(loaded)).first;
          }
          const Task before = task;
          RETURN_IF_ERROR(ExpireLease(task, job->second.spec.max_attempts, options_.retry, now));
          writes.charges[task.job_id] += rules::EndedAttemptTime(before, task, now);
        }
        for (const Task& task : writes.tasks) {
          if (IsTerminal(task.state)) writes.ended.push_back(&task);
        }
        RETURN_IF_ERROR(WriteAttempts(c, writes, now, &settle_later));
        return writes.tasks;
      });
  if (expired.ok()) SettleLater(settle_later, now);
  return expired;
}

absl::StatusOr<std::vector<Executor>> PostgresMetadataStore::MarkLostExecutors(absl::Time cutoff, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<Executor>> {
    ASSIGN_OR_RETURN(
        PgResult result,
        c.Exec(sql::kSilentExecutors, Params()
                                          .Text(Name(ExecutorStateName(ExecutorState::kLost)))
                                          .Time(cutoff)
                                          .Text(Name(ExecutorStateName(ExecutorState::kRevoked)))));
    std::vector<Executor> lost;
    for (int i = 0; i < result.Rows(); ++i) {
      ASSIGN_OR_RETURN(Executor executor, rows::ReadExecutor(Row{result, i}));
      rules::MarkLost(executor);
      RETURN_IF_ERROR(SaveExecutor(c, executor));
      lost.push_back(std::move(executor));
    }
    return lost;
  });
}

// --- fault injection (tests) ---

void PostgresMetadataStore::InjectCommitFaultForTesting(CommitFault fault, int times) {
  transactions_.InjectCommitFault(fault, times);
}

int PostgresMetadataStore::CommitFaultsInjectedForTesting() { return transactions_.CommitFaultsInjected(); }

void PostgresMetadataStore::InjectHeartbeatCommitFaultForTesting(CommitFault fault, int times) {
  heartbeat_transactions_.InjectCommitFault(fault, times);
}

int PostgresMetadataStore::HeartbeatCommitFaultsInjectedForTesting() {
  return heartbeat_transactions_.CommitFaultsInjected();
}

}  // namespace minions

#pragma once
// SqliteMetadataStore: the MetadataStore on one SQLite file (or ":memory:"), the embedded default
// for a single machine.
//
// - The file is in WAL mode with a busy timeout, so several processes (a server and a watchdog)
//   may open it at once; every method is one transaction, and those that write begin with
//   BEGIN IMMEDIATE so that two writers serialise instead of failing half-way.
// - Open applies the schema migrations the file lacks (store/sqlite/sqlite_migrations.h) and
//   refuses a file whose schema is newer than this binary (FailedPrecondition).
// - Jobs, tasks and executors are in sqlite_metadata_store.cc; teams and credentials (the
//   IdentityStore half) in sqlite_identity_store.cc.
// - Each object owns one connection, guarded by a mutex: all methods may be called from any
//   thread; calls on one object run one at a time.
// - Errors: besides the MetadataStore contract, a database still locked by another process after
//   the busy timeout is Unavailable; a corrupt or unreadable file is Internal.

#include <map>
#include <optional>
#include <memory>
#include <random>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "store/metadata_store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace minions {
namespace sqlite_store {
class Statement;  // a prepared statement in use (sqlite_metadata_store.cc)
}  // namespace sqlite_store

class SqliteMetadataStore : public MetadataStore {
 public:
  // `path` is a file name (created when missing) or ":memory:" for a private in-memory database.
  static absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> Open(const std::string& path,
                                                                  const StoreOptions& options);
  ~SqliteMetadataStore() override;
  SqliteMetadataStore(const SqliteMetadataStore&) = delete;
  SqliteMetadataStore& operator=(const SqliteMetadataStore&) = delete;

  // --- MetadataStore ---
  absl::StatusOr<Job> CreateJob(const JobSpec& spec, absl::Time now) override;
  absl::Status AddTasks(const std::string& job_id, const std::vector<Task>& tasks, int64_t total_records,
                        absl::Time now) override;
  absl::StatusOr<Job> GetJob(const std::string& job_id) override;
  absl::StatusOr<std::vector<Job>> ListJobs(const JobFilter& filter) override;
  absl::StatusOr<std::vector<Task>> ListTasks(const std::string& job_id) override;
  absl::StatusOr<Task> GetTask(const std::string& job_id, int64_t task_index) override;
  absl::StatusOr<std::vector<Task>> GetTasks(const std::vector<std::pair<std::string, int64_t>>& keys) override;
  absl::StatusOr<TaskStateCounts> CountTasks(const std::string& job_id) override;
  absl::StatusOr<bool> AnyTaskPending() override;
  absl::StatusOr<Job> CancelJob(const std::string& job_id, absl::Time now) override;
  absl::StatusOr<Job> FailJob(const std::string& job_id, const std::string& error, absl::Time now) override;
  absl::StatusOr<std::vector<Job>> JobsToFinalize(int limit, absl::Time now) override;
  absl::StatusOr<Job> FinishJob(const std::string& job_id, const std::string& output_key,
                                const std::string& errors_key, const std::string& manifest_key,
                                absl::Time now, JobState outcome = JobState::kCompleted,
                                const TokenUsage& tokens = {}) override;
  absl::StatusOr<Job> ExpireJob(const std::string& job_id, absl::Time now) override;
  absl::StatusOr<Task> RequestBackup(const std::string& job_id, int64_t task_index, int attempt,
                                     absl::Time now) override;

  absl::StatusOr<Executor> RegisterExecutor(const std::string& executor_id, const ExecutorInfo& info,
                                            absl::Time now) override;
  absl::StatusOr<Executor> GetExecutor(const std::string& executor_id) override;
  absl::StatusOr<std::vector<Executor>> ListExecutors() override;
  absl::StatusOr<std::vector<Task>> ListRunningTasks() override;
  absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& executor_id, ExecutorState state,
                                           const std::string& reason, const std::vector<LeaseProgress>& held,
                                           absl::Duration ttl, absl::Time now,
                                           const std::optional<ModelHoldings>& holdings = std::nullopt) override;
  absl::StatusOr<std::vector<HeartbeatReply>> Heartbeats(const std::vector<HeartbeatCall>& calls, absl::Duration ttl,
                                                         absl::Time now) override;
  absl::Status RequestDrain(const std::string& executor_id, absl::Time now) override;

  absl::StatusOr<std::vector<TeamUsage>> ListTeamUsage(absl::Time now) override;
  absl::Duration WarmWait() const override { return options_.EffectiveWarmWait(); }
  absl::StatusOr<std::vector<Lease>> LeaseTasks(const std::string& executor_id, int max_tasks,
                                                absl::Duration ttl, absl::Time now) override;
  absl::StatusOr<Task> CompleteTask(const std::string& executor_id, const std::string& job_id,
                                    int64_t task_index, int attempt, int64_t records_done,
                                    int64_t records_failed, absl::Time now) override;
  absl::StatusOr<CompletionReply> CompleteMany(const std::vector<CompletionCall>& calls, absl::Time now) override;
  absl::StatusOr<Task> FailTask(const std::string& executor_id, const std::string& job_id, int64_t task_index,
                                int attempt, FailureClass failure, const std::string& message,
                                absl::Time now,
                                const std::vector<Chunk>& chunks = {}) override;

  absl::Status ClaimObjectStore(const std::string& identity, absl::Time now) override;
  absl::StatusOr<std::string> RecordedObjectStore() override;
  absl::Status RecordThroughput(const ThroughputKey& key, const ThroughputSample& sample, absl::Time now) override;
  absl::StatusOr<std::optional<Throughput>> GetThroughput(const ThroughputKey& key) override;
  absl::StatusOr<std::vector<Task>> ExpireLeases(absl::Time now, int limit) override;
  absl::StatusOr<std::vector<Executor>> MarkLostExecutors(absl::Time cutoff, absl::Time now) override;

  // --- IdentityStore (sqlite_identity_store.cc) ---
  absl::StatusOr<Team> CreateTeam(const Team& team) override;
  absl::StatusOr<Team> UpdateTeam(const Team& team) override;
  absl::StatusOr<Team> GetTeam(const std::string& name) override;
  absl::StatusOr<std::vector<Team>> ListTeams() override;

  // GangStore ({sqlite,postgres}_gang_store.cc)
  absl::Status RecordGang(const GangLease& gang) override;
  absl::StatusOr<GangLease> GangOf(const std::string& executor_id) override;
  absl::StatusOr<std::vector<GangLease>> ListGangs() override;
  absl::Status EndGang(const std::string& job_id, int64_t task_index, int attempt) override;
  absl::StatusOr<std::optional<GangTaskRef>> NextGangTask(absl::Time now) override;
  absl::StatusOr<Lease> LeaseToGang(const GangLease& gang, absl::Duration ttl, absl::Time now) override;

  // ModelStore (sqlite_model_store.cc / postgres_model_store.cc)
  absl::StatusOr<ModelRecord> AddModel(const ModelRecord& model) override;
  absl::StatusOr<ModelRecord> GetModel(const std::string& team, const std::string& name,
                                       const std::string& digest) override;
  absl::StatusOr<std::vector<ModelRecord>> ListModels(const std::string& team) override;
  absl::StatusOr<RemovedModels> RemoveModel(const std::string& team, const std::string& name,
                                            const std::string& digest) override;
  absl::Status AddToken(const TokenRecord& token) override;
  absl::StatusOr<TokenRecord> FindToken(const std::string& secret_hash) override;
  absl::StatusOr<TokenRecord> GetToken(const std::string& token_id) override;
  absl::StatusOr<std::vector<TokenRecord>> ListTokens(const TokenFilter& filter) override;
  absl::StatusOr<TokenRecord> RevokeToken(const std::string& token_id, absl::Time now) override;
  absl::Status RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) override;
  absl::StatusOr<std::vector<std::string>> RevokedTokensSince(absl::Time since) override;
  absl::StatusOr<Executor> EnrolExecutor(const std::string& join_secret_hash, TokenRecord& credential,
                                         const ExecutorInfo& info, absl::Time now) override;
  absl::StatusOr<Executor> RevokeExecutor(const std::string& executor_id, absl::Time now) override;

  // The schema version of the open database (the number of applied migrations).
  absl::StatusOr<int> SchemaVersion();

 private:
  using Statement = sqlite_store::Statement;

  SqliteMetadataStore(sqlite3* db, const StoreOptions& options);

  // Applies the missing migrations, each in its own transaction.
  absl::Status Migrate(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `body` inside BEGIN IMMEDIATE (write) or BEGIN (read) ... COMMIT, rolling back when it
  // returns an error. `Result` is absl::Status or absl::StatusOr<T>.
  // Takes mu_. Each body starts with mu_.AssertHeld(): clang's thread-safety analysis checks a
  // lambda on its own and cannot see that InTransaction holds the lock while it runs.
  template <typename Body>
  auto InTransaction(bool write, Body&& body) -> decltype(body());

  // A cached prepared statement for constant `sql`, reset and with its bindings cleared.
  absl::StatusOr<Statement> Prepare(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "job-" / "exe-" followed by 12 random lowercase hex digits.
  std::string NewId(const char* prefix) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Row helpers, all inside a transaction.
  absl::StatusOr<Job> LoadJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveJob(const Job& job, bool insert = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Task> LoadTask(const std::string& job_id, int64_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveTask(const Task& task, bool insert = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<Task>> LoadTasks(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Executor> LoadExecutor(const std::string& executor_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A row of the settings table; "" when it has none.
  absl::StatusOr<std::string> LoadSetting(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveExecutor(const Executor& executor, bool insert = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<Team>> LoadTeam(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<TeamUsage>> LoadTeamUsage(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges ended attempts (their wall time by job id, rules::EndedAttemptTime) to their jobs and
  // to their teams' decayed usage as of `now`, times each job's devices per attempt.
  absl::Status ChargeUsage(const std::map<std::string, absl::Duration>& by_job, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<TokenRecord> LoadToken(const char* sql, const char* parameter, const std::string& value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveToken(const TokenRecord& token, bool insert = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<Job>> QueryJobs(Statement& statement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<Task>> QueryTasks(Statement& statement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a job that has not ended (cancelled or failed): its unfinished tasks are cancelled.
  absl::StatusOr<Job> EndJob(const std::string& job_id, JobState state, const std::string& error,
                             absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fenced end of an attempt: loads job and task, checks the fence, applies `transition` to
  // the task, and accounts the task on its job when it became terminal.
  template <typename Transition>
  absl::StatusOr<Task> FinishAttempt(const std::string& executor_id, const std::string& job_id,
                                     int64_t task_index, int attempt, Transition&& transition,
                                     absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // sqlite3_busy_handler: while another connection (or process) holds the write lock, waits on
  // the clock a little longer each time, for up to kBusyTimeout per statement.
  static int OnBusy(void* store, int count);

  const StoreOptions options_;
  RealClock real_clock_;  // when options_.clock is null
  Clock* const clock_;
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_GUARDED_BY(mu_);  // owned; closed by the destructor
  absl::Time busy_since_ ABSL_GUARDED_BY(mu_);  // when the current statement first found the database busy
  // Prepared statements by their (constant) SQL text's address; finalized by the destructor.
  std::map<const char*, sqlite3_stmt*> statements_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);  // for ids; seeded from std::random_device
};

template <typename Body>
auto SqliteMetadataStore::InTransaction(bool write, Body&& body) -> decltype(body()) {
  absl::MutexLock lock(&mu_);
  // BEGIN IMMEDIATE takes the write lock up front (waiting up to the busy timeout): a deferred
  // transaction that reads and then writes could fail mid-way when another process wrote first.
  RETURN_IF_ERROR(Exec(write ? "BEGIN IMMEDIATE" : "BEGIN"));
  auto result = body();
  if (!result.ok()) {
    (void)Exec("ROLLBACK");
    return result;
  }
  if (absl::Status committed = Exec("COMMIT"); !committed.ok()) {
    (void)Exec("ROLLBACK");
    return committed;
  }
  return result;
}

}  // namespace minions

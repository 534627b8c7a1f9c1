#pragma once
// SqliteTransaction: the row operations (store/row_store.h RowTransaction) of one SQLite
// transaction, in the SQL of sqlite_statements.h. SQLite has one writer at a time (a writing
// transaction holds the database's write lock from its BEGIN IMMEDIATE), so rows need no locks of
// their own and Locking is ignored; a statement or two per row, each a few microseconds in
// process, so batches are loops.
// Borrows the connection for the transaction's life; the thread of SqliteRowStore::Run, under its
// mutex.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "store/common/store_rows.h"
#include "store/metadata_store.h"
#include "store/row_transaction.h"
#include "store/sqlite/sqlite_connection.h"

namespace minions::sqlite_store {

class SqliteTransaction : public RowTransaction {
 public:
  // `where`: the database as a message names it (its path).
  SqliteTransaction(Connection& connection, const StoreOptions& options, const std::string& where)
      : c_(connection), options_(options), where_(where) {}

  absl::StatusOr<Rows> Read(const RowKeys& keys, Locking locking) override;
  absl::Status Insert(const RowWrites& rows) override;
  absl::Status Update(const RowWrites& rows, bool last) override;

  absl::StatusOr<std::vector<Job>> ListJobs(const JobFilter& filter) override;
  absl::StatusOr<std::vector<Job>> JobsInState(JobState state, int limit) override;
  absl::StatusOr<std::vector<std::string>> UnsettledJobs() override;
  absl::StatusOr<int64_t> CountActiveJobs(const std::string& team) override;
  absl::StatusOr<std::vector<Job>> ActiveJobsNeedingModel(const std::string& team, const std::string& digest) override;
  absl::StatusOr<std::string> LastFailure(const std::string& job_id) override;
  absl::Status SetJobTokens(const std::string& job_id, const TokenUsage& tokens) override;

  absl::StatusOr<std::vector<Task>> TasksOfJob(const std::string& job_id) override;
  absl::StatusOr<std::vector<Task>> RunningTasks() override;
  absl::StatusOr<TaskStateCounts> CountTasks(const std::string& job_id) override;
  absl::StatusOr<bool> AnyTaskPending() override;
  absl::StatusOr<std::vector<Task>> ExpiredLeases(absl::Time now, int limit) override;
  absl::StatusOr<std::vector<Task>> TasksHeldBy(const std::string& executor_id) override;
  absl::StatusOr<std::map<std::string, absl::Time>> ChargedUntil(const std::vector<std::string>& executor_ids) override;
  absl::StatusOr<std::vector<LeaseCandidate>> LeaseCandidates(const LeaseQuery& query,
                                                              std::map<std::string, Job>& jobs) override;
  absl::StatusOr<std::vector<PendingGangTask>> PendingGangTasks(absl::Time now, int limit) override;

  absl::StatusOr<std::vector<Executor>> ListExecutors() override;
  absl::StatusOr<std::vector<Executor>> SilentExecutors(absl::Time cutoff) override;

  absl::StatusOr<std::vector<TeamUsage>> TeamStandings(absl::Time now) override;
  absl::StatusOr<std::map<std::string, int64_t>> LockTeamUsage(const std::set<std::string>& teams) override;

  absl::StatusOr<std::vector<Team>> ListTeams() override;
  absl::StatusOr<std::vector<TokenRecord>> ListTokens(const TokenFilter& filter) override;
  absl::StatusOr<std::vector<TokenRecord>> LiveExecutorTokens(const std::string& executor_id) override;
  absl::Status RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) override;
  absl::StatusOr<std::vector<std::string>> RevokedTokensSince(absl::Time since) override;

  absl::StatusOr<std::vector<ModelRecord>> ModelsNamed(const std::string& team, const std::string& name,
                                                       const std::string& digest, Locking locking) override;
  absl::StatusOr<std::optional<ModelRecord>> ModelWithDigest(const std::string& team,
                                                             const std::string& digest) override;
  absl::StatusOr<std::vector<ModelRecord>> ListModels(const std::string& team) override;
  absl::Status DeleteModel(const ModelRecord& model) override;
  absl::StatusOr<int64_t> CountModelsWithDigest(const std::string& team, const std::string& digest) override;

  absl::StatusOr<std::optional<GangLease>> SeatOf(const std::string& executor_id) override;
  absl::StatusOr<std::optional<GangLease>> GangOfAttempt(const std::string& job_id, int64_t task_index,
                                                         int attempt) override;
  absl::StatusOr<std::vector<GangLease>> ListGangs() override;
  absl::StatusOr<bool> InsertGang(const GangLease& gang) override;
  absl::StatusOr<int64_t> DeleteGang(const std::string& job_id, int64_t task_index, int attempt) override;

  absl::Status InsertSettingIfAbsent(const std::string& name, const std::string& value, absl::Time at) override;
  absl::StatusOr<std::string> Setting(const std::string& name) override;
  absl::Status AddThroughputSample(const ThroughputKey& key, const ThroughputSample& sample, absl::Time now) override;
  absl::StatusOr<std::optional<Throughput>> GetThroughput(const ThroughputKey& key) override;
  absl::Status InsertFleetHistory(const FleetHistoryRow& row, absl::Time keep_after) override;
  absl::StatusOr<std::vector<FleetHistoryRow>> ListFleetHistory(absl::Time since) override;
  absl::Status AddFleetTokens(absl::Time at, const std::string& team, const TokenUsage& tokens) override;
  absl::Status PruneFleetTokens(absl::Time keep_after) override;
  absl::StatusOr<std::vector<FleetTokensRow>> ListFleetTokens(absl::Time since) override;
  absl::Status InsertVerification(const Verification& verification) override;
  absl::StatusOr<std::vector<Verification>> VerificationsOfJob(const std::string& job_id) override;
  absl::Status InsertVerificationTasks(const std::vector<VerificationTask>& tasks) override;
  absl::StatusOr<std::vector<VerificationTask>> LeasableVerificationTasks(const std::string& executor_id,
                                                                          absl::Time now, int64_t limit) override;
  absl::StatusOr<std::optional<VerificationTask>> GetVerificationTask(const std::string& job_id, int64_t task_index,
                                                                      int attempt, int seq) override;
  absl::Status UpdateVerificationTask(const VerificationTask& task) override;
  absl::Status DeleteVerificationTask(const VerificationTask& task) override;
  absl::StatusOr<int64_t> CountVerificationTasks(const std::string& job_id) override;

  absl::Status EndAttempts(const AttemptWrites& writes, absl::Time now, std::set<std::string>* finished) override;

  absl::Status LockSchema() override;
  absl::StatusOr<SchemaState> SchemaVersion() override;
  absl::Status ApplyMigration(const store_common::Migration& migration) override;

 private:
  // The statements that write each kind of row (Insert's, or Update's: no model), and a job's
  // values for them.
  struct RowStatements {
    const char* job;
    const char* task;
    const char* executor;
    const char* team;
    const char* token;
    const char* model;
    store_rows::Values (*job_values)(const Job&);
  };
  absl::Status WriteRows(const RowWrites& rows, const RowStatements& sql);
  // Runs `sql` with its values bound (positional) and checks that it changed one row.
  absl::Status WriteRow(const char* sql, const store_rows::Values& values, const char* what);
  // The task of each key (in key order), skipping those that do not exist.
  absl::StatusOr<std::vector<Task>> TasksByKey(const std::vector<TaskId>& keys);
  // Charges ended attempts (their wall time by job id, store_rules EndedAttemptTime) to their jobs
  // and to their teams' decayed usage as of `now`, times each job's devices per attempt.
  absl::Status ChargeUsage(const std::map<std::string, absl::Duration>& by_job, absl::Time now);

  Connection& c_;
  const StoreOptions& options_;
  const std::string& where_;
};

}  // namespace minions::sqlite_store

#pragma once
// PostgresTransaction: the row operations (store/row_store.h RowTransaction) of one PostgreSQL
// transaction, in the SQL of postgres_statements.h, on one pooled connection (pg_connection.h).
//
// - Round trips: rows are read and written set-based (one statement per kind of row:
//   unnest(...) of arrays), and the statements of one Read, Insert or Update go out together in
//   one round trip (libpq pipeline mode), the first of a transaction with its BEGIN. An Update
//   marked last, and EndAttempts, go out with the COMMIT.
// - Locking: in a writing transaction a Read locks what it reads (FOR UPDATE) in the store's lock
//   order; the queries that pick rows to change (a lease's candidates, expired leases, silent
//   executors) skip rows another transaction holds (SKIP LOCKED) instead of waiting.
// - Counts: a job's counts live in counter shards (job_counts, migration 2); EndAttempts
//   adds to one shard chosen at random, so completers of one job do not queue on its row, and
//   asks right after its COMMIT (same round trip) which jobs' tasks have all ended.
// Borrows the connection and the options for the transaction's life; the thread of
// PostgresRowStore::Run.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "store/metadata_store.h"
#include "store/postgres/pg_connection.h"
#include "store/row_transaction.h"

namespace minions::postgres_store {

class PostgresTransaction : public RowTransaction {
 public:
  PostgresTransaction(Connection& connection, const StoreOptions& options) : c_(connection), options_(options) {}

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
  // Whether a Read with `locking` locks (a writing transaction that asks to).
  bool Locks(Locking locking) const { return locking == Locking::kLock && c_.for_update(); }

  Connection& c_;
  const StoreOptions& options_;
};

}  // namespace minions::postgres_store

#pragma once
// PostgresMetadataStore: the MetadataStore on a PostgreSQL database, for several servers (and a
// watchdog) sharing one store. The same semantics as SqliteMetadataStore, and the same row mapping
// and transition plumbing (store/common/); every transition goes through model/state_machines.h
// (load the rows FOR UPDATE, apply, write back).
//
// - Counts: a job's counts (tasks done and succeeded, records completed and failed) are kept in
//   counter rows, several shards per job (job_counts; see postgres_migrations.cc): the end of an
//   attempt adds to one shard chosen at random instead of locking and rewriting the job row, so
//   completers of one job do not queue on it. Reading a job sums its shards. Whether a job's last
//   task ended is asked right after the COMMIT of each transaction that ended tasks (in the same
//   round trip): of transactions ending a job's last tasks at once, none can see the others'
//   counts before committing, but the one that commits last sees them all after. That job alone
//   is then locked and settled (finalizing, or failed) in a transaction of its own;
//   JobsToFinalize first sweeps up jobs left unsettled (a server died in between).
// - Round trips: rows are read and written set-based (one statement per kind of row:
//   UPDATE ... FROM unnest(...)); BEGIN goes out with a transaction's first statement and, where
//   nothing can fail after it, COMMIT with its last (libpq pipeline mode). Statements are prepared
//   once per connection and keep their generic plans (plan_cache_mode = force_generic_plan):
//   left to choose, PostgreSQL would plan those taking arrays again on every call.
// - Isolation: READ COMMITTED with row locks. A writing method locks every row it loads
//   (SELECT ... FOR UPDATE) before applying a transition to it, so no update is lost; leasing
//   picks its tasks with FOR UPDATE SKIP LOCKED, so servers leasing at once take disjoint tasks
//   without waiting on each other (and, as PostgreSQL re-checks a locked row's WHERE clause
//   against its newest version, never a task another transaction just granted). SERIALIZABLE
//   would add predicate-lock aborts on every concurrent lease for no extra safety here.
//   Lock order: tasks (in key order) -> executor -> job -> counter shards (in job order); settling
//   locks a job alone, after the commit that ended its tasks. Leasing
//   locks its executor first but never waits for a task (SKIP LOCKED keeps the lock of a row it
//   then rejects, one another server just granted, so any method taking job -> task would
//   deadlock against it). A deadlock that still happens is broken by PostgreSQL (after
//   deadlock_timeout) and retried.
// - Retries and commit verification: every method runs as one transaction through a
//   TransactionRunner (pg_transaction_runner.h): a transaction the database broke off (the
//   connection lost, a serialization failure or deadlock) is run again for up to 30 seconds,
//   then the method is Unavailable; a COMMIT whose answer was lost is looked up, not run twice.
// - Teams and credentials (the IdentityStore half) are in postgres_identity_store.cc; its SQL is
//   in postgres_statements.h with the rest.
// - Open applies the schema migrations the database lacks (store/postgres/postgres_migrations.h)
//   under pg_advisory_xact_lock, and refuses a schema newer than this binary (FailedPrecondition).
//   The schema is the first one in the connection's search_path.
// - A fixed pool of connections (made lazily, re-made when broken) serves all threads; a method
//   waits for a free connection (pg_connection.h). Heartbeats have a connection of their own
//   (their batches commit one at a time, server/heartbeat_batcher.h): in a burst of leases and
//   completions that fill the pool, a batch of heartbeats never waits for a connection (measured
//   at 10,000 executors: 20-45 ms of a heartbeat batch's time went to that wait).
// - All SQL is constant text with $n parameters; values are always bound (postgres_statements.h).
//
// The watchdog's lock on the same database is PostgresWatchdogLock (postgres_watchdog_lock.h).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "store/metadata_store.h"
#include "store/postgres/commit_fault.h"
#include "store/postgres/pg_transaction_runner.h"

namespace minions {

class PostgresMetadataStore : public MetadataStore {
 public:
  // `conninfo` is a libpq URL (postgresql://user@host:port/db?...) or key=value string. Fails
  // with Unavailable when the server cannot be reached now. Opens up to `pool_size` connections,
  // and one more for heartbeats.
  static absl::StatusOr<std::unique_ptr<PostgresMetadataStore>> Open(const std::string& conninfo,
                                                                     const StoreOptions& options, int pool_size = 4);
  ~PostgresMetadataStore() override;
  PostgresMetadataStore(const PostgresMetadataStore&) = delete;
  PostgresMetadataStore& operator=(const PostgresMetadataStore&) = delete;

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
  absl::StatusOr<Job> FinishJob(const std::string& job_id, const std::string& output_key, const std::string& errors_key,
                                const std::string& manifest_key, absl::Time now, JobState outcome = JobState::kCompleted,
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
  absl::StatusOr<std::vector<Lease>> LeaseTasks(const std::string& executor_id, int max_tasks, absl::Duration ttl,
                                                absl::Time now) override;
  absl::StatusOr<std::vector<absl::StatusOr<std::vector<Lease>>>> LeaseMany(const std::vector<LeaseAsk>& asks,
                                                                          absl::Duration ttl, absl::Time now) override;
  absl::StatusOr<Task> CompleteTask(const std::string& executor_id, const std::string& job_id, int64_t task_index,
                                    int attempt, int64_t records_done, int64_t records_failed, absl::Time now) override;
  absl::StatusOr<CompletionReply> CompleteMany(const std::vector<CompletionCall>& calls, absl::Time now) override;
  absl::StatusOr<Task> FailTask(const std::string& executor_id, const std::string& job_id, int64_t task_index,
                                int attempt, FailureClass failure, const std::string& message, absl::Time now,
                                const std::vector<Chunk>& chunks = {}) override;

  absl::Status ClaimObjectStore(const std::string& identity, absl::Time now) override;
  absl::StatusOr<std::string> RecordedObjectStore() override;
  absl::Status RecordThroughput(const ThroughputKey& key, const ThroughputSample& sample, absl::Time now) override;
  absl::StatusOr<std::optional<Throughput>> GetThroughput(const ThroughputKey& key) override;
  absl::StatusOr<std::vector<Task>> ExpireLeases(absl::Time now, int limit) override;
  absl::StatusOr<std::vector<Executor>> MarkLostExecutors(absl::Time cutoff, absl::Time now) override;

  // --- IdentityStore (postgres_identity_store.cc) ---
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

  // The schema version of the database (the highest applied migration).
  absl::StatusOr<int> SchemaVersion();

  // For tests of the lost-COMMIT path: the next `times` COMMITs of writing transactions go wrong.
  // kConnectionLostBeforeCommit: the connection breaks before COMMIT is sent (the transaction
  // rolls back). kAnswerLost: COMMIT is sent, then the connection breaks before its answer is
  // read (the transaction commits; the store must not run it again).
  using CommitFault = postgres_store::CommitFault;
  // On the main pool's transactions (not heartbeats', which run on their own connection).
  void InjectCommitFaultForTesting(CommitFault fault, int times = 1);
  // How many injected faults have happened.
  int CommitFaultsInjectedForTesting();
  // The same on the heartbeats' own connection (their batches' COMMIT).
  void InjectHeartbeatCommitFaultForTesting(CommitFault fault, int times = 1);
  int HeartbeatCommitFaultsInjectedForTesting();
  // Both pools' (MetadataStore::ConflictsRetried).
  int64_t ConflictsRetried() const override {
    return transactions_.conflicts_retried() + heartbeat_transactions_.conflicts_retried();
  }

 private:
  using Connection = postgres_store::Connection;

  PostgresMetadataStore(std::unique_ptr<postgres_store::ConnectionPool> pool,
                        std::unique_ptr<postgres_store::ConnectionPool> heartbeat_pool, const StoreOptions& options);

  // Applies the missing migrations, each in its own transaction.
  absl::Status Migrate();

  // TransactionRunner::InTransaction on the store's pool.
  template <typename Body>
  auto InTransaction(bool write, Body&& body) -> decltype(body(std::declval<Connection&>())) {
    return transactions_.InTransaction(write, std::forward<Body>(body));
  }

  // "job-" / "exe-" followed by 12 random lowercase hex digits.
  std::string NewId(const char* prefix) ABSL_LOCKS_EXCLUDED(random_mu_);

  // Row helpers, all inside a transaction. In a writing transaction, loads lock what they read.
  absl::StatusOr<Job> LoadJob(Connection& c, const std::string& job_id);
  absl::Status SaveJob(Connection& c, const Job& job, bool insert = false);  // all but its counts
  absl::StatusOr<std::vector<Task>> LoadTasks(Connection& c, const std::string& job_id);
  // The tasks with these keys that exist, in key order.
  absl::StatusOr<std::vector<Task>> LoadTasks(Connection& c, const std::vector<std::pair<std::string, int64_t>>& keys);
  absl::Status SaveTasks(Connection& c, const std::vector<Task>& tasks, bool insert = false);
  absl::StatusOr<Executor> LoadExecutor(Connection& c, const std::string& executor_id);
  absl::Status SaveExecutor(Connection& c, const Executor& executor, bool insert = false);
  // The team, if it exists (locked in a writing transaction).
  absl::StatusOr<std::optional<Team>> LoadTeam(Connection& c, const std::string& name);
  // The token whose id (or hash, `by_hash`) is `key` (locked in a writing transaction).
  absl::StatusOr<TokenRecord> LoadToken(Connection& c, const std::string& key, bool by_hash);
  absl::Status SaveToken(Connection& c, const TokenRecord& token, bool insert = false);
  // Ends a job that has not ended (cancelled or failed): its unfinished tasks are cancelled.
  absl::StatusOr<Job> EndJob(Connection& c, const std::string& job_id, JobState state, const std::string& error,
                             absl::Time now);

  // The end of attempts, shared by CompleteTask(s), FailTask, ExpireLeases and EndJob: writes
  // `tasks` (as the state machine left them), adds `ended` (those of them that reached a terminal
  // state) to their jobs' counts and `records` to the executor's, in one statement. NotFound
  // when `executor_id` is given and unknown. With `settle_later`, right after the COMMIT (in the
  // same round trip) it asks which of the jobs now have every task ended and adds those to it,
  // for SettleLater.
  // Every team's standing (MetadataStore::ListTeamUsage).
  absl::StatusOr<std::vector<TeamUsage>> LoadTeamUsage(Connection& c, absl::Time now);
  // What ending attempts writes, in one statement (WriteAttempts).
  struct AttemptWrites {
    std::vector<Task> tasks;         // to write back
    std::vector<const Task*> ended;  // those of them that reached a terminal state
    // What they add to their jobs' counts, when not CountTerminalTask of `ended` (an expiry).
    std::optional<std::map<std::string, Job>> counted;
    std::map<std::string, int64_t> records;  // added to the executors' records_done, by executor
    std::map<std::string, absl::Duration> charges;  // wall time of attempts that ended, by job (EndedAttemptTime)
  };
  absl::Status WriteAttempts(Connection& c, const AttemptWrites& writes, absl::Time now,
                             std::set<std::string>* settle_later);
  // Settles job `job_id` (finalizing, or failed) if all its tasks have ended; locks it only then.
  // Whether it settled it to finalizing.
  absl::StatusOr<bool> SettleIfDone(Connection& c, const std::string& job_id, absl::Time now);
  // SettleIfDone for each of `job_ids`, in a transaction of its own; the jobs it settled to
  // finalizing, sorted. Best effort: what it misses (the server died in between) JobsToFinalize's
  // sweep settles.
  std::vector<std::string> SettleLater(const std::set<std::string>& job_ids, absl::Time now);
  // The fenced end of reported attempts, each call's by its executor: loads the tasks (and, for
  // several calls, locks the executors), checks each report's fence, applies `transition` to each
  // fenced task, then WriteAttempts. One status per report of each call; NotFound for a call
  // whose executor is unknown. `finished` receives each report's task as written (an empty Task
  // for a refused one), call after call.
  template <typename Transition>
  absl::StatusOr<std::vector<absl::StatusOr<std::vector<absl::Status>>>> FinishAttempts(
      Connection& c, const std::vector<CompletionCall>& calls, Transition&& transition, absl::Time now,
      std::vector<Task>* finished, std::set<std::string>& settle_later);

  const StoreOptions options_;
  RealClock real_clock_;  // when options_.clock is null
  postgres_store::TransactionRunner transactions_;  // owns the connection pool
  postgres_store::TransactionRunner heartbeat_transactions_;  // Heartbeats' own (one connection)
  absl::Mutex random_mu_;
  std::mt19937_64 random_ ABSL_GUARDED_BY(random_mu_);  // for ids; seeded from std::random_device
};

}  // namespace minions

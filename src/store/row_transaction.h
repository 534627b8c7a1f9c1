#pragma once
// RowTransaction: the row operations of one transaction of a MetadataStore backend (RowStore,
// store/row_store.h, runs them; store/row_store.h's header says what a backend provides).
// Keyed rows are read (Read), inserted (Insert) and updated (Update) in batches, so that a
// backend can make one round trip of many rows; the queries that pick rows by what they hold (a
// lease's candidates, expired leases, silent executors, ...) are named methods; one compound write
// ends attempts (EndAttempts: tasks, job counts, executor records and device time together).
// - Locking: in a writing transaction, what a Read returns is locked until the transaction ends
//   (Locking::kLock) where the backend locks rows (PostgreSQL: FOR UPDATE); a backend with one
//   writer at a time (SQLite) needs no row locks. One Read locks its rows in the store's lock
//   order: tasks (in key order), executors (in id order), jobs, teams, tokens.
// Errors: AlreadyExists when an Insert's key is taken; NotFound when an Update's row is gone;
// Unavailable when the backend cannot be reached (after its own retries); Internal for a corrupt
// row or a failed statement.
// Threads: a RowTransaction belongs to the thread running the transaction's body, and lives only
// while the body runs.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/fair_share.h"
#include "model/identity.h"
#include "model/task_sizing.h"
#include "model/types.h"
#include "model/verification.h"
#include "store/common/migration.h"
#include "store/gang_store.h"
#include "store/identity_store.h"
#include "store/metadata_store.h"

namespace minions {


// A task's key: (job id, task index).
using TaskId = std::pair<std::string, int64_t>;

enum class Locking {
  kLock,  // in a writing transaction, the rows read stay locked until it ends (where rows lock)
  kNone,  // read as committed (or as this transaction wrote them), locking nothing
};

// Which keyed rows a Read loads (each list in any order, duplicates allowed).
struct RowKeys {
  std::vector<TaskId> tasks;
  std::vector<std::string> executors;
  // Only whether each of `executors` exists: Rows::executors then holds rows with just their id
  // (a backend may read and lock less).
  bool executor_ids_only = false;
  std::vector<std::string> jobs;
  std::vector<std::string> teams;
  std::vector<std::string> tokens;        // by id
  std::vector<std::string> token_hashes;  // by the SHA-256 of their text
};

// The rows a Read found, by key; a key without a row is absent.
struct Rows {
  std::map<TaskId, Task> tasks;
  std::map<std::string, Executor> executors;
  std::map<std::string, Job> jobs;
  std::map<std::string, Team> teams;
  std::map<std::string, TokenRecord> tokens;  // by id, those found by hash too
};

// Rows to insert or update, written in one round trip where the backend can. A job is written but
// for its counts, its device time and its tokens (EndAttempts adds to the first two;
// SetJobTokens writes the last). Models are only ever inserted.
struct RowWrites {
  std::vector<Job> jobs;
  std::vector<Task> tasks;
  std::vector<Executor> executors;
  std::vector<Team> teams;
  std::vector<TokenRecord> tokens;
  std::vector<ModelRecord> models;
  bool empty() const {
    return jobs.empty() && tasks.empty() && executors.empty() && teams.empty() && tokens.empty() && models.empty();
  }
};

// What ending attempts writes (RowTransaction::EndAttempts).
struct AttemptWrites {
  std::vector<Task> tasks;  // the tasks, as the rules left them
  // What they add to their jobs' counts, by job: model CountTerminalTask applied to a zeroed Job
  // (tasks_done, tasks_succeeded, counts.completed and counts.failed).
  std::map<std::string, Job> counts;
  std::map<std::string, int64_t> records;          // added to the executors' records_done, by executor
  std::map<std::string, absl::Duration> charges;  // wall time of the attempts that ended, by job
  // Executors whose time was charged up to a point (store_rules ChargedUntil): the stored point
  // moves there, never back.
  std::map<std::string, absl::Time> charged_until;
  bool empty() const {
    return tasks.empty() && counts.empty() && records.empty() && charges.empty() && charged_until.empty();
  }
};

// What a lease's candidate query selects for one executor (RowTransaction::LeaseCandidates).
struct LeaseQuery {
  absl::Time now;                     // tasks backing off until later are skipped
  int64_t memory_bytes = 0;           // the executor's usable memory (placement.h UsableMemory)
  std::vector<std::string> runners;   // the runner kinds it runs
  std::string fair_share_ranks;       // store_rules::FairShareRanksJson: teams ranked -1 are skipped
  std::string loaded_model;           // the digest it has loaded ("" none)
  std::vector<std::string> cached_models;  // the digests it holds on disk
  absl::Time cold_before;             // a cold executor takes jobs submitted before this only
  bool model_affinity = true;         // off: every job is as warm as any other
  // Its runners are fully confined: false skips jobs that require it (Requirements::confined).
  bool confined = false;
  int64_t limit = 1;
};

// One pending task a lease may grant, with its job's team.
struct LeaseCandidate {
  Task task;
  std::string team;
};

// A pending task of a gang job (RowTransaction::PendingGangTasks).
struct PendingGangTask {
  TaskId task;
  std::string team;
};

// Where the schema stands (RowTransaction::SchemaVersion).
struct SchemaState {
  int version = 0;    // the highest migration applied
  std::string where;  // the database, as a message names it ("/var/lib/minions.db", "(PostgreSQL database x, schema y)")
};

// The row operations of one transaction (see the header comment).
class RowTransaction {
 public:
  virtual ~RowTransaction() = default;

  // --- keyed rows ---
  virtual absl::StatusOr<Rows> Read(const RowKeys& keys, Locking locking = Locking::kLock) = 0;
  // AlreadyExists when a row's key (a token's hash too) is taken; the caller's transaction then
  // writes nothing of the call.
  virtual absl::Status Insert(const RowWrites& rows) = 0;
  // `last`: nothing of the transaction follows (a backend may send it with its COMMIT).
  virtual absl::Status Update(const RowWrites& rows, bool last = false) = 0;

  // --- jobs ---
  virtual absl::StatusOr<std::vector<Job>> ListJobs(const JobFilter& filter) = 0;
  // Jobs in `state`, oldest first; `limit` <= 0: all.
  virtual absl::StatusOr<std::vector<Job>> JobsInState(JobState state, int limit) = 0;
  // Jobs still queued or running with tasks, all of which have ended (settling missed them).
  virtual absl::StatusOr<std::vector<std::string>> UnsettledJobs() = 0;
  // The team's jobs that have not ended.
  virtual absl::StatusOr<int64_t> CountActiveJobs(const std::string& team) = 0;
  // The team's jobs that have not ended and need the model bytes `digest`, oldest first.
  virtual absl::StatusOr<std::vector<Job>> ActiveJobsNeedingModel(const std::string& team,
                                                                  const std::string& digest) = 0;
  // The last_error of the job's failed task that ended last ("" when none failed).
  virtual absl::StatusOr<std::string> LastFailure(const std::string& job_id) = 0;
  // A finished job's tokens (the one write of them).
  virtual absl::Status SetJobTokens(const std::string& job_id, const TokenUsage& tokens) = 0;

  // --- tasks ---
  // The job's tasks by index (locked as a Read's).
  virtual absl::StatusOr<std::vector<Task>> TasksOfJob(const std::string& job_id) = 0;
  // Every running task, by executor id, then job id and index.
  virtual absl::StatusOr<std::vector<Task>> RunningTasks() = 0;
  // The job's pending and running tasks counted (TaskStateCounts: pending, running, executors,
  // records_in_flight).
  virtual absl::StatusOr<TaskStateCounts> CountTasks(const std::string& job_id) = 0;
  virtual absl::StatusOr<bool> AnyTaskPending() = 0;
  // Up to `limit` (<= 0: all) running tasks whose lease expired by `now`, by expiry, locked; a
  // backend may skip tasks another transaction holds.
  virtual absl::StatusOr<std::vector<Task>> ExpiredLeases(absl::Time now, int limit) = 0;
  // Tasks `executor_id` may hold (running attempts and shadows of its), by key, locked. A backend
  // may return more (the rules decide).
  virtual absl::StatusOr<std::vector<Task>> TasksHeldBy(const std::string& executor_id) = 0;
  // When each of `executor_ids` was last charged for an attempt (store_rules ChargedUntil; an
  // executor never charged, or unknown, is absent). Not locked: a caller that moves the point
  // holds the executors' rows already.
  virtual absl::StatusOr<std::map<std::string, absl::Time>> ChargedUntil(
      const std::vector<std::string>& executor_ids) = 0;
  // Pending tasks `query` may grant, in grant order (fair-share rank, priority, warmth, age, index),
  // up to query.limit, locked (a backend may skip tasks another transaction holds). Adds to `jobs`
  // the candidates' jobs it lacks, with what placement reads of them: id, spec, state, created_at,
  // started_at.
  virtual absl::StatusOr<std::vector<LeaseCandidate>> LeaseCandidates(const LeaseQuery& query,
                                                                      std::map<std::string, Job>& jobs) = 0;
  // Pending tasks of gang jobs that may run (job queued or running, not backing off at `now`),
  // highest priority, then oldest job, then index first; at most `limit`.
  virtual absl::StatusOr<std::vector<PendingGangTask>> PendingGangTasks(absl::Time now, int limit) = 0;

  // --- executors ---
  virtual absl::StatusOr<std::vector<Executor>> ListExecutors() = 0;  // by registration, then id
  // Executors neither lost nor revoked not heard from since `cutoff`, locked (a backend may skip
  // one whose heartbeat is being written).
  virtual absl::StatusOr<std::vector<Executor>> SilentExecutors(absl::Time cutoff) = 0;

  // --- fair share ---
  // Every team's standing as of `now` (store_rows::ReadTeamUsage).
  virtual absl::StatusOr<std::vector<TeamUsage>> TeamStandings(absl::Time now) = 0;
  // Locks these teams' usage rows, in name order, until the transaction ends, and answers their
  // running tasks as locked. A backend with one writer at a time locks nothing and answers nothing.
  virtual absl::StatusOr<std::map<std::string, int64_t>> LockTeamUsage(const std::set<std::string>& teams) = 0;

  // --- teams and credentials ---
  virtual absl::StatusOr<std::vector<Team>> ListTeams() = 0;
  virtual absl::StatusOr<std::vector<TokenRecord>> ListTokens(const TokenFilter& filter) = 0;
  // The executor's credentials that are not revoked, by id, locked.
  virtual absl::StatusOr<std::vector<TokenRecord>> LiveExecutorTokens(const std::string& executor_id) = 0;
  // last_used_at = `at` for these credentials, where it is earlier (or unset).
  virtual absl::Status RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) = 0;
  virtual absl::StatusOr<std::vector<std::string>> RevokedTokensSince(absl::Time since) = 0;

  // --- models ---
  // The team's rows of `name` (only `digest`'s unless it is ""), newest first.
  virtual absl::StatusOr<std::vector<ModelRecord>> ModelsNamed(const std::string& team, const std::string& name,
                                                               const std::string& digest, Locking locking) = 0;
  // The team's first row (oldest, then by name) of the bytes `digest`.
  virtual absl::StatusOr<std::optional<ModelRecord>> ModelWithDigest(const std::string& team,
                                                                     const std::string& digest) = 0;
  // The team's models ("" every team's), by team, name, then newest first.
  virtual absl::StatusOr<std::vector<ModelRecord>> ListModels(const std::string& team) = 0;
  virtual absl::Status DeleteModel(const ModelRecord& model) = 0;
  virtual absl::StatusOr<int64_t> CountModelsWithDigest(const std::string& team, const std::string& digest) = 0;

  // --- gangs (seat rows: store/common/gang_rows.h) ---
  // The gang seat of `executor_id`, as a gang of that one seat.
  virtual absl::StatusOr<std::optional<GangLease>> SeatOf(const std::string& executor_id) = 0;
  // Every seat of that attempt's gang.
  virtual absl::StatusOr<std::optional<GangLease>> GangOfAttempt(const std::string& job_id, int64_t task_index,
                                                                 int attempt) = 0;
  virtual absl::StatusOr<std::vector<GangLease>> ListGangs() = 0;  // oldest first, then job, task
  // Inserts `gang`'s seats: false when a seat's executor sits in another gang or the attempt has
  // one (some seats may be in: the caller's transaction then fails).
  virtual absl::StatusOr<bool> InsertGang(const GangLease& gang) = 0;
  // Removes that attempt's seats; how many there were.
  virtual absl::StatusOr<int64_t> DeleteGang(const std::string& job_id, int64_t task_index, int attempt) = 0;

  // --- settings and task sizes ---
  virtual absl::Status InsertSettingIfAbsent(const std::string& name, const std::string& value, absl::Time at) = 0;
  virtual absl::StatusOr<std::string> Setting(const std::string& name) = 0;  // "" when unset
  // Adds one sample to `key`'s throughput, the old sums weighted by kThroughputMemory first.
  virtual absl::Status AddThroughputSample(const ThroughputKey& key, const ThroughputSample& sample,
                                           absl::Time now) = 0;
  virtual absl::StatusOr<std::optional<Throughput>> GetThroughput(const ThroughputKey& key) = 0;

  // --- the dashboard's history (migration 16) ---
  // Inserts `row` unless its time is there; deletes the rows before `keep_after`.
  virtual absl::Status InsertFleetHistory(const FleetHistoryRow& row, absl::Time keep_after) = 0;
  virtual absl::StatusOr<std::vector<FleetHistoryRow>> ListFleetHistory(absl::Time since) = 0;  // oldest first
  // --- the dashboard's tokens per step (migration 18) ---
  // Adds `tokens` to (at, team)'s counts (a row made when none); deletes the rows before `keep_after`.
  virtual absl::Status AddFleetTokens(absl::Time at, const std::string& team, const TokenUsage& tokens) = 0;
  virtual absl::Status PruneFleetTokens(absl::Time keep_after) = 0;
  virtual absl::StatusOr<std::vector<FleetTokensRow>> ListFleetTokens(absl::Time since) = 0;  // oldest first

  // --- verification (model/verification.h) ---
  // AlreadyExists when this verifier's verdict on the record is there.
  virtual absl::Status InsertVerification(const Verification& verification) = 0;
  // By time, then record, then verifier.
  virtual absl::StatusOr<std::vector<Verification>> VerificationsOfJob(const std::string& job_id) = 0;

  // --- spot checks (migration 17; model/verification.h VerificationTask) ---
  // Inserts the tasks, skipping any whose chunk (job, task, attempt, seq) was drawn already.
  virtual absl::Status InsertVerificationTasks(const std::vector<VerificationTask>& tasks) = 0;
  // Up to `limit` tasks `executor_id` may take: another producer's, pending or their lease expired
  // by `now`, oldest first, locked (a backend may skip tasks another transaction holds).
  virtual absl::StatusOr<std::vector<VerificationTask>> LeasableVerificationTasks(const std::string& executor_id,
                                                                                  absl::Time now, int64_t limit) = 0;
  // The task of that chunk, locked; nullopt when there is none.
  virtual absl::StatusOr<std::optional<VerificationTask>> GetVerificationTask(const std::string& job_id,
                                                                              int64_t task_index, int attempt,
                                                                              int seq) = 0;
  // Writes a task's verifier and lease expiry.
  virtual absl::Status UpdateVerificationTask(const VerificationTask& task) = 0;
  virtual absl::Status DeleteVerificationTask(const VerificationTask& task) = 0;
  // The job's tasks not yet reported.
  virtual absl::StatusOr<int64_t> CountVerificationTasks(const std::string& job_id) = 0;

  // --- ending attempts ---
  // Writes `writes` as of `now`: the tasks; what they add to their jobs' counts; the records the
  // executors did; the attempts' wall time times their jobs' devices per attempt
  // (store_rules::DeviceTime) added to their jobs' device time and, decayed as model/fair_share.h
  // says, to their teams' usage. With Settling::kAfterCommit it is the transaction's last write,
  // and `finished` (when given) receives once it has committed which jobs of writes.counts are
  // queued or running with every task ended; with kInTransaction it receives them at once.
  virtual absl::Status EndAttempts(const AttemptWrites& writes, absl::Time now, std::set<std::string>* finished) = 0;

  // --- the schema (RowMetadataStore's migrations) ---
  // Serialises migrating with every other process on the store until the transaction ends, and
  // makes sure the table of applied migrations exists.
  virtual absl::Status LockSchema() = 0;
  virtual absl::StatusOr<SchemaState> SchemaVersion() = 0;
  // Runs the migration's statements and records it as applied.
  virtual absl::Status ApplyMigration(const store_common::Migration& migration) = 0;
};

}  // namespace minions

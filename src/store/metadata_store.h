#pragma once
// MetadataStore: everything durable about jobs, tasks and executors. The server holds no state of
// its own; several servers may share one store.
//
// Contract (every implementation passes tests/store/metadata_store_contract.h):
// - Each method is one transaction: it happens entirely or not at all. One consequence may follow
//   in a transaction of its own: a call that ends a job's last tasks (CompleteTask(s), FailTask,
//   ExpireLeases) settles that job (finalizing, or failed when no task succeeded) before it
//   returns, and a backend whose concurrent completers do not lock the job's row (PostgreSQL,
//   where only the completer that commits last can see that every task has ended) settles it in
//   a second transaction right after the first commits. Settling is idempotent; a job left
//   unsettled by a process that died in between is settled by JobsToFinalize.
// - Every time a method writes or compares comes from its `now` (or `cutoff`) argument; no
//   implementation reads the clock for that. A backend that has to wait (a busy database, the
//   backoff of a retry) waits on the Clock of its StoreOptions.
// - Transitions go through the pure functions of model/state_machines.h, never hand-written SQL
//   logic, so every backend applies the same rules.
// - Errors: NotFound for an unknown job/executor/task; FailedPrecondition for a transition the
//   state forbids (a stale attempt, a cancel of a finished job) with a message that says why;
//   Unavailable when the backend cannot be reached (callers may retry).
// Threads: implementations are thread-safe.

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "model/fair_share.h"
#include "model/state_machines.h"
#include "model/task_sizing.h"
#include "model/types.h"
#include "model/verification.h"
#include "store/gang_store.h"
#include "store/identity_store.h"
#include "store/model_store.h"

namespace minions {

// ClaimObjectStore's rule: OK when `identity` is the object store `recorded` on the database (or
// none is recorded yet), else FailedPrecondition naming both and what to do.
inline absl::Status CheckObjectStore(const std::string& recorded, const std::string& identity) {
  if (recorded.empty() || recorded == identity) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the servers on this database keep their objects in ", recorded, ", but this server is configured with ",
      identity, ": its jobs' inputs and results would be where the other servers and their executors never look. "
      "Give every server on one database the same object store ([objects] url / --objects), or give this server "
      "a database of its own"));
}
// The settings row (migration 8) that holds the object store's identity.
inline constexpr char kObjectStoreSetting[] = "object_store";

// One point of the dashboard's history as stored: its time and its JSON document (FleetView's).
struct FleetHistoryRow {
  absl::Time at;
  std::string point;
  bool operator==(const FleetHistoryRow&) const = default;
};

// The tokens a team's answers used in one step of the dashboard's history, summed over the
// servers that admitted them (each adds its own).
struct FleetTokensRow {
  absl::Time at;
  std::string team;
  TokenUsage tokens;
  bool operator==(const FleetTokensRow&) const = default;
};

// One executor's heartbeat, as MetadataStore::Heartbeats takes several at once.
struct HeartbeatCall {
  std::string executor_id;
  ExecutorState state = ExecutorState::kAvailable;
  std::string reason;
  std::vector<LeaseProgress> held;
  std::optional<ModelHoldings> holdings;
  // A renewal on the executor's behalf (the server's, from its idle poll): written only if the
  // store has heard nothing from the executor since this time. One heard since (its own beat,
  // written first, even in the same batch) said more, its state, and renewed it too: the renewal is
  // skipped (its reply says only `drain`), so a renewal that waited never overwrites a newer state.
  std::optional<absl::Time> unless_heard_since;
};

// One executor's completion reports, as MetadataStore::CompleteMany takes several executors' at
// once.
struct CompletionCall {
  std::string executor_id;
  std::vector<LeaseProgress> reports;
};

// One executor's Lease call, as MetadataStore::LeaseMany takes several executors' at once.
struct LeaseAsk {
  std::string executor_id;
  int max_tasks = 1;
};

// What MetadataStore::CompleteMany answers.
struct CompletionReply {
  // One per call, in order: one status per report (as CompleteTasks answers), or NotFound when the
  // call's executor is unknown.
  std::vector<absl::StatusOr<std::vector<absl::Status>>> outcomes;
  // The jobs these completions left ready to finalize (settled to finalizing by this call, not
  // by another), sorted. A job whose every task failed is settled failed and is not named.
  std::vector<std::string> finalizing;
};

struct JobFilter {
  std::optional<JobState> state;
  std::string team;     // empty: all teams
  int limit = 100;      // newest first
};

// How many of a job's tasks are in each state, and how many executors run them (for watching a
// job without listing its tasks).
struct TaskStateCounts {
  int64_t pending = 0;
  int64_t running = 0;
  int64_t done = 0;       // in a terminal state (the job's tasks_done)
  int64_t succeeded = 0;  // of those, succeeded
  int64_t executors = 0;  // distinct holders of the running tasks
  int64_t records_in_flight = 0;  // records done so far by the running attempts (their records_done)
};

struct StoreOptions {
  RetryPolicy retry;
  // What a backend waits on when it must wait (a busy database, a retry's backoff); it is never
  // asked the time of a write (methods take `now`). Null: real time. Borrowed; outlives the store.
  Clock* clock = nullptr;
  // How fast a team's past usage is forgotten (model/fair_share.h): halved every this long.
  absl::Duration fair_share_half_life = kDefaultFairShareHalfLife;
  // Delay scheduling: how long after its submission a job's tasks wait for an executor that holds
  // its registry model (loaded or cached) before a cold executor may take them.
  absl::Duration warm_wait = absl::Seconds(3);
  // Model affinity: the lease prefers executors warm for a job's model and applies warm_wait.
  // Off (server.model_affinity = false: for benchmarks and operators who compare): no warm
  // preference and no wait; any executor that can run a job takes its tasks in the fleet's order
  // (fair share, priority, age).
  bool model_affinity = true;
  // The warm-executor wait the lease applies: warm_wait, or none without model affinity.
  absl::Duration EffectiveWarmWait() const { return model_affinity ? warm_wait : absl::ZeroDuration(); }
  // Spot checks (docs/verification.md): when on, every chunk that commits has records drawn
  // (`verification`) for another executor to re-score, and its job publishes only once they are
  // reported. Off: chunks are only stamped with their producer.
  bool spot_checks = false;
  VerificationPolicy verification;
};

// A MetadataStore is also the IdentityStore (identity_store.h): teams and credentials live in the
// same database, so enrolling or revoking an executor changes its row and its credentials at once.
// It is the ModelStore (model_store.h) too: removing a model checks the jobs that need it. And the
// GangStore (gang_store.h): a gang's seats name its task.
class MetadataStore : public IdentityStore, public ModelStore, public GangStore {
 public:
  ~MetadataStore() override = default;

  // The delay-scheduling wait LeaseTasks applies (StoreOptions::EffectiveWarmWait), for explaining
  // a wait with the same rules (model/placement.h ExplainWait).
  virtual absl::Duration WarmWait() const { return StoreOptions{}.EffectiveWarmWait(); }
  // Times the database aborted one of this store's transactions to resolve a conflict with another
  // (a deadlock, a serialization failure) since it opened; the store ran each again while its
  // retry window allowed. Its lock order should keep this at 0; a store whose transactions cannot
  // conflict (SQLite: one writer) answers 0.
  virtual int64_t ConflictsRetried() const { return 0; }

  // --- jobs ---
  // Creates a job in `validating` with a fresh id. ResourceExhausted when its team already has
  // its limit of jobs that have not ended (Team::max_active_jobs; store_rules::CheckJobQuota).
  virtual absl::StatusOr<Job> CreateJob(const JobSpec& spec, absl::Time now) = 0;
  // Validation is done: stores the tasks (state pending, attempt 0), sets counts.total and n_tasks,
  // and moves the job to `queued`. A job may not be given tasks twice.
  virtual absl::Status AddTasks(const std::string& job_id, const std::vector<Task>& tasks,
                                int64_t total_records, absl::Time now) = 0;
  virtual absl::StatusOr<Job> GetJob(const std::string& job_id) = 0;
  virtual absl::StatusOr<std::vector<Job>> ListJobs(const JobFilter& filter) = 0;
  virtual absl::StatusOr<std::vector<Task>> ListTasks(const std::string& job_id) = 0;
  // One task; NotFound for an unknown job or task. (What a report about one lease is checked
  // against, without listing the job's tasks.)
  virtual absl::StatusOr<Task> GetTask(const std::string& job_id, int64_t task_index) = 0;
  // The tasks of `keys` (job id, task index) that exist, in one read, in key order (each once).
  // (What a batch of reports is checked against.) The default reads them one at a time.
  virtual absl::StatusOr<std::vector<Task>> GetTasks(const std::vector<std::pair<std::string, int64_t>>& keys) {
    std::vector<std::pair<std::string, int64_t>> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    std::vector<Task> tasks;
    for (const auto& [job_id, index] : sorted) {
      absl::StatusOr<Task> task = GetTask(job_id, index);
      if (absl::IsNotFound(task.status())) continue;
      RETURN_IF_ERROR(task.status());
      tasks.push_back(*std::move(task));
    }
    return tasks;
  }
  // The job's tasks counted by state; NotFound for an unknown job. Its cost grows with the tasks
  // that are pending or running, not with the job's size.
  virtual absl::StatusOr<TaskStateCounts> CountTasks(const std::string& job_id) = 0;
  // Cancels a job that has not ended: its pending and running tasks become cancelled (executors
  // holding them are told so in their next heartbeat). FailedPrecondition if the job has ended.
  virtual absl::StatusOr<Job> CancelJob(const std::string& job_id, absl::Time now) = 0;
  // Fails a job that has not ended (validation failed, input unreadable), with a message.
  virtual absl::StatusOr<Job> FailJob(const std::string& job_id, const std::string& error,
                                      absl::Time now) = 0;
  // Jobs in `finalizing`, oldest first, after settling (as of `now`) any job whose tasks have all
  // ended but that is still queued or running (see the contract above).
  virtual absl::StatusOr<std::vector<Job>> JobsToFinalize(int limit, absl::Time now) = 0;
  // finalizing -> `outcome` (completed, or expired for a job whose window passed) with the result
  // keys and the tokens its published answers used (Job::tokens). FailedPrecondition unless
  // finalizing: of two servers finishing one job, exactly one succeeds.
  virtual absl::StatusOr<Job> FinishJob(const std::string& job_id, const std::string& output_key,
                                        const std::string& errors_key, const std::string& manifest_key,
                                        absl::Time now, JobState outcome = JobState::kCompleted,
                                        const TokenUsage& tokens = {}) = 0;
  // The job's completion window has passed: applies ExpireJob (model/state_machines.h) to it and
  // its unfinished tasks. FailedPrecondition if the window has not passed or the job has ended.
  virtual absl::StatusOr<Job> ExpireJob(const std::string& job_id, absl::Time now) = 0;

  // --- executors ---
  // Registers a new executor, or re-registers `executor_id` (keeping its id) after a restart.
  virtual absl::StatusOr<Executor> RegisterExecutor(const std::string& executor_id,
                                                    const ExecutorInfo& info, absl::Time now) = 0;
  virtual absl::StatusOr<Executor> GetExecutor(const std::string& executor_id) = 0;
  virtual absl::StatusOr<std::vector<Executor>> ListExecutors() = 0;
  // Every running task (of any job), by executor id, then job id and index: what each executor
  // is working on now.
  virtual absl::StatusOr<std::vector<Task>> ListRunningTasks() = 0;
  // Records that the executor is alive and in `state` (reason: why), renews the leases in `held`
  // that are still its own (RenewLease: lease extended, progress stored, chunks committed), and
  // answers which of them it must stop. An unknown executor gets `unknown_executor`. `holdings`,
  // when given, replaces what the executor holds of the models (ExecutorInfo models and
  // model_loaded); absent, they stay as they were.
  virtual absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& executor_id, ExecutorState state,
                                                   const std::string& reason,
                                                   const std::vector<LeaseProgress>& held,
                                                   absl::Duration ttl, absl::Time now,
                                                   const std::optional<ModelHoldings>& holdings = std::nullopt) = 0;
  // Several executors' heartbeats in one transaction (group commit: the server gathers the
  // heartbeats that arrive while the last batch commits). Each is applied, in order, exactly as
  // Heartbeat would apply it alone (fencing, renewals and cancels unchanged) and answered in
  // order; an error of the store fails the whole batch (nothing of it is written). The default
  // makes one transaction per call.
  virtual absl::StatusOr<std::vector<HeartbeatReply>> Heartbeats(const std::vector<HeartbeatCall>& calls,
                                                                 absl::Duration ttl, absl::Time now) {
    std::vector<HeartbeatReply> replies;
    for (const HeartbeatCall& call : calls) {
      ASSIGN_OR_RETURN(HeartbeatReply reply,
                       Heartbeat(call.executor_id, call.state, call.reason, call.held, ttl, now, call.holdings));
      replies.push_back(std::move(reply));
    }
    return replies;
  }
  // Asks an executor to finish (or hand back) its tasks and take no more.
  virtual absl::Status RequestDrain(const std::string& executor_id, absl::Time now) = 0;

  // --- leasing ---
  // Grants up to `max_tasks` pending tasks the executor can run (its memory and runners meet the
  // job's requirements: UsableMemory holds the job's min_memory_bytes, its runners include the
  // job's) in the fleet's scheduling order: teams by fair share first (the team furthest below
  // its share; model/fair_share.h FairShareRanks over ListTeamUsage), then highest job priority,
  // then jobs whose registry model the executor has loaded, then cached, then the others, then
  // oldest job, then task index. A team at its max_running_tasks gets none. An executor that
  // holds a job's registry model neither loaded nor cached gets its tasks only once the job was
  // submitted at least StoreOptions::warm_wait ago (delay scheduling).
  // Tasks backing off (not_before > now) are skipped; a lost, draining or unknown executor gets
  // none. Each granted task gets attempt + 1 and lease_expires_at = now + ttl; its job becomes
  // running. One transaction: it reads the small team_usage table, not the teams' attempts.
  virtual absl::StatusOr<std::vector<Lease>> LeaseTasks(const std::string& executor_id, int max_tasks,
                                                        absl::Duration ttl, absl::Time now) = 0;
  // Several executors' leases in one transaction (group commit: the server gathers the Lease calls
  // that look for work while the last batch commits). Each ask is applied, in order, exactly as
  // LeaseTasks would apply it just after the asks before it (their grants taken, fair-share ranks
  // and quotas counting them), and answered on its own: an unknown executor's ask is NotFound and
  // the others go on. An error for the whole batch: nothing of it granted. This default leases
  // each ask in a transaction of its own.
  virtual absl::StatusOr<std::vector<absl::StatusOr<std::vector<Lease>>>> LeaseMany(const std::vector<LeaseAsk>& asks,
                                                                                  absl::Duration ttl, absl::Time now) {
    std::vector<absl::StatusOr<std::vector<Lease>>> answers;
    answers.reserve(asks.size());
    for (const LeaseAsk& ask : asks) answers.push_back(LeaseTasks(ask.executor_id, ask.max_tasks, ttl, now));
    return answers;
  }
  // Whether any task of any job is pending (backing off or not, leasable by anyone or not): false
  // means no executor would be granted anything now. One cheap read; a store that cannot tell
  // answers true.
  virtual absl::StatusOr<bool> AnyTaskPending() { return true; }
  // Fenced: only the current attempt of the lease holder may complete or fail a task. CompleteTask
  // reports no chunks (the attempt's records form one chunk); CompleteTasks commits each report's
  // chunks (model CompleteTask).
  virtual absl::StatusOr<Task> CompleteTask(const std::string& executor_id, const std::string& job_id,
                                            int64_t task_index, int attempt, int64_t records_done,
                                            int64_t records_failed, absl::Time now) = 0;
  // Completes several attempts of one executor in one transaction (an executor finishing many
  // small tasks reports them together). Each report is fenced on its own: the answer holds one
  // status per report, and a refused report does not stop the others. NotFound if the executor
  // is unknown. (CompleteMany with one call.)
  absl::StatusOr<std::vector<absl::Status>> CompleteTasks(const std::string& executor_id,
                                                          const std::vector<LeaseProgress>& reports, absl::Time now) {
    ASSIGN_OR_RETURN(CompletionReply reply, CompleteMany({CompletionCall{executor_id, reports}}, now));
    if (reply.outcomes.size() != 1) return absl::InternalError("the store answered no completion");
    return std::move(reply.outcomes.front());
  }
  // Several executors' completions in one transaction (group commit: the server gathers the
  // completions that arrive while the last batch commits). Each call's reports are applied, in
  // order, exactly as CompleteTasks would apply them alone (fenced report by report; an unknown
  // executor's call is NotFound and the others go on), and the answer names the jobs that became
  // ready to finalize, so that the caller need not read them. An error of the store fails the
  // whole batch (nothing of it is written).
  virtual absl::StatusOr<CompletionReply> CompleteMany(const std::vector<CompletionCall>& calls, absl::Time now) = 0;
  // FailTask applies model FailAttempt: `chunks` (the attempt's uploads) are committed first.
  virtual absl::StatusOr<Task> FailTask(const std::string& executor_id, const std::string& job_id,
                                        int64_t task_index, int attempt, FailureClass failure,
                                        const std::string& message, absl::Time now,
                                        const std::vector<Chunk>& chunks = {}) = 0;

  // Every team (those in the teams table, and any other whose jobs have run) with its weight,
  // quota, running tasks and usage decayed to `now` (with the store's fair_share_half_life),
  // running attempts' time so far included (times the executors each holds). An attempt's device
  // time is charged to its job's team when it completes, fails, is handed back, its lease expires
  // or its job ends, and a straggler's at its backup request (store_rules EndedAttemptTime); by name.
  virtual absl::StatusOr<std::vector<TeamUsage>> ListTeamUsage(absl::Time now) = 0;

  // --- the servers' agreement ---
  // The object store every server on this database keeps its objects in, by `identity` (where
  // it is: a folder's absolute path, an S3 bucket, prefix and endpoint). The first server records
  // it; a server with another is refused (FailedPrecondition naming both): its objects would be
  // where no other server and no executor of theirs looks.
  virtual absl::Status ClaimObjectStore(const std::string& identity, absl::Time now) = 0;
  // The object store recorded by ClaimObjectStore; "" when no server has claimed one yet.
  virtual absl::StatusOr<std::string> RecordedObjectStore() = 0;

  // --- task sizes (model/task_sizing.h) ---
  // Adds one finished attempt's sample to `key`'s throughput (the old sums weighted by
  // kThroughputMemory first), in one statement: concurrent completions on several servers all count.
  virtual absl::Status RecordThroughput(const ThroughputKey& key, const ThroughputSample& sample,
                                        absl::Time now) = 0;
  // `key`'s throughput; nullopt when no attempt of it was measured yet.
  virtual absl::StatusOr<std::optional<Throughput>> GetThroughput(const ThroughputKey& key) = 0;

  // --- the dashboard's history (dashboard/fleet_view.h) ---
  // Records `row` unless a point with the same time is there (the servers of a fleet record the
  // same step once: the first one wins), and removes the points older than `keep_after`, so the
  // history stays bounded. One transaction.
  virtual absl::Status RecordFleetHistory(const FleetHistoryRow& row, absl::Time keep_after) = 0;
  // The points at or after `since`, oldest first.
  virtual absl::StatusOr<std::vector<FleetHistoryRow>> ListFleetHistory(absl::Time since) = 0;
  // Adds `tokens` (team -> the tokens this server admitted) to step `at`'s counts, every server
  // its own, in one statement per team (concurrent servers all count), and removes the counts of
  // steps older than `keep_after`. One transaction.
  virtual absl::Status AddFleetTokens(absl::Time at, const std::map<std::string, TokenUsage>& tokens,
                                      absl::Time keep_after) = 0;
  // The counts of the steps at or after `since`, oldest first (then by team).
  virtual absl::StatusOr<std::vector<FleetTokensRow>> ListFleetTokens(absl::Time since) = 0;

  // --- watchdog ---
  // Requeues (or fails, past max_attempts) up to `limit` running tasks whose lease has expired;
  // returns them as they are now.
  virtual absl::StatusOr<std::vector<Task>> ExpireLeases(absl::Time now, int limit) = 0;
  // Stragglers: attempt `attempt` of a running task gets a backup (model RequestBackup): the task
  // goes back to pending for another executor while the attempt runs on as its shadow. The
  // attempt's time so far is charged now; its time after, only if it wins.
  // FailedPrecondition if the task is not running that attempt or has a backup already.
  virtual absl::StatusOr<Task> RequestBackup(const std::string& job_id, int64_t task_index, int attempt,
                                             absl::Time now) = 0;
  // Executors not heard from since `cutoff` become lost; returns them.
  virtual absl::StatusOr<std::vector<Executor>> MarkLostExecutors(absl::Time cutoff, absl::Time now) = 0;

  // --- verification (model/verification.h, docs/verification.md) ---
  // Records a verifier's verdict on one record of a producer's answer (its time: `now`); a failed
  // one quarantines the producer in the same transaction (model Quarantine: no leases, its held
  // leases not renewed, sticky until ReleaseExecutor). Answers the producer as it is after.
  // InvalidArgument when the verifier is the producer or no record is named; NotFound for an
  // unknown job, producer or verifier; AlreadyExists when this verifier judged the record before.
  virtual absl::StatusOr<Executor> RecordVerification(const Verification& /*verification*/, absl::Time /*now*/) {
    return absl::UnimplementedError("this store keeps no verifications");
  }
  // A job's verdicts, by time, then record, then verifier. NotFound for an unknown job.
  virtual absl::StatusOr<std::vector<Verification>> ListVerifications(const std::string& /*job_id*/) {
    return absl::UnimplementedError("this store keeps no verifications");
  }
  // An admin lifts a quarantine: the executor is available again. FailedPrecondition unless it is
  // quarantined; NotFound for an unknown executor.
  virtual absl::StatusOr<Executor> ReleaseExecutor(const std::string& /*executor_id*/, absl::Time /*now*/) {
    return absl::UnimplementedError("this store keeps no verifications");
  }

  // --- spot checks (model/verification.h VerificationTask, docs/verification.md) ---
  // Up to `max_tasks` verification tasks for `executor_id` to re-score, each leased to it until
  // now + ttl: another producer's, pending or their lease expired, of jobs it could run itself,
  // oldest first. An executor that may not lease (lost, draining, quarantined, revoked, pending)
  // gets none; NotFound for an unknown one.
  virtual absl::StatusOr<std::vector<VerificationTask>> LeaseVerifications(const std::string& /*executor_id*/,
                                                                           int /*max_tasks*/, absl::Duration /*ttl*/,
                                                                           absl::Time /*now*/) {
    return absl::UnimplementedError("this store keeps no verification tasks");
  }
  // One verification task by its chunk (`key`'s job_id, task_index, attempt, seq); NotFound when
  // none is open.
  virtual absl::StatusOr<VerificationTask> GetVerificationTask(const VerificationTask& /*key*/) {
    return absl::UnimplementedError("this store keeps no verification tasks");
  }
  // The verdicts of `verifier_id` on the task `key` names, one per record, in the task's order:
  // each checked one is recorded as RecordVerification records it (a failed one quarantines the
  // producer, in the same transaction), and the task ends. Answers the producer as it is after.
  // NotFound when the task is not open; PermissionDenied unless `verifier_id` holds its lease
  // (unexpired at `now`) and is neither quarantined nor revoked; InvalidArgument unless the
  // verdicts name the task's records, in order, with their custom_ids (an unchecked verdict may
  // have none: a record whose input line is not JSON has none). A refused report writes nothing.
  virtual absl::StatusOr<Executor> ReportVerifications(const std::string& /*verifier_id*/,
                                                       const VerificationTask& /*key*/,
                                                       const std::vector<RecordVerdict>& /*verdicts*/,
                                                       absl::Time /*now*/) {
    return absl::UnimplementedError("this store keeps no verification tasks");
  }
  // The job's verification tasks not yet reported (its publication waits for them). NotFound for
  // an unknown job.
  virtual absl::StatusOr<int64_t> CountOpenVerifications(const std::string& /*job_id*/) { return int64_t{0}; }
};

}  // namespace minions

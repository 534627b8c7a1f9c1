#pragma once
// The backend-agnostic half of every MetadataStore method: what a method does to the rows it has
// loaded, before the backend writes them back. The rules themselves are model/state_machines.h's;
// these functions are the plumbing around them that the SQLite and PostgreSQL stores would
// otherwise each spell out (checks and messages, which fields a method sets). Pure; any thread.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/fair_share.h"
#include "model/identity.h"
#include "model/placement.h"
#include "model/state_machines.h"
#include "model/types.h"

namespace minions::store_rules {

// A fresh job in `validating`, id left to the caller.
Job NewJob(const JobSpec& spec, absl::Time now);

// AddTasks: checks that `job` may get tasks and that `given` are valid (distinct non-negative
// indexes holding `total_records`), moves the job to queued (finalizing when there are none), and
// returns the fresh tasks to insert (only the shard's extent comes from the caller).
absl::StatusOr<std::vector<Task>> AddTasksToJob(Job& job, const std::vector<Task>& given, int64_t total_records,
                                                absl::Time now);

// CancelJob/FailJob: ends `job` (FailedPrecondition if it has ended) and cancels its unfinished
// tasks among `tasks` (all of the job's tasks), accounting them on the job. Returns the tasks
// that changed.
absl::StatusOr<std::vector<Task>> EndJob(Job& job, JobState state, const std::string& error, std::vector<Task>& tasks,
                                         absl::Time now);

// FinishJob: finalizing -> `outcome` (completed or expired) with the result keys and the tokens
// its answers used (FailedPrecondition otherwise).
absl::Status FinishJob(Job& job, const std::string& output_key, const std::string& errors_key,
                       const std::string& manifest_key, absl::Time now, JobState outcome,
                       const TokenUsage& tokens);

// RegisterExecutor: a (re)started executor starts afresh: available, no drain pending (a drained
// executor that is started again is back in service); `exists` says whether it was known. A
// revoked executor stays revoked (only its info and times change).
void RegisterExecutor(Executor& executor, bool exists, const ExecutorInfo& info, absl::Time now);

// Whether a renewal made at `unless_heard_since` (HeartbeatCall's) comes after the executor was
// heard from since (its own beat, even one written earlier in the same batch): then it is skipped,
// never written over that beat's state.
bool HeardSince(const Executor& executor, const std::optional<absl::Time>& unless_heard_since);

// Heartbeat: alive again if it was lost, in the state it reports, except that a drain asked for
// stays visible until the executor itself reports draining, and a revoked executor stays revoked.
// `holdings`, when given, replaces what it holds of the models.
void RecordHeartbeat(Executor& executor, ExecutorState state, const std::string& reason, absl::Time now,
                     const std::optional<ModelHoldings>& holdings = std::nullopt);

// Heartbeat, per held lease: renews `task` for `progress` (model RenewLease: lease, progress,
// chunks) when it is still the executor's current attempt or the task's shadow (true), else leaves
// it alone (false: the executor must stop it).
bool RenewLease(Task& task, const std::string& executor_id, const LeaseProgress& progress, absl::Duration ttl,
                absl::Time now);

// RequestDrain.
void RequestDrain(Executor& executor);

// LeaseTasks: whether `executor` may be granted tasks at all, and the runner kinds it runs.
bool MayLease(const Executor& executor, int max_tasks);
std::vector<std::string> RunnersOf(const Executor& executor);
// Whether a candidate the lease query selected may be granted to `executor` (model/placement.h
// PlaceOn: runner, memory, warm-executor wait): the query's SQL is an index over these rules; this
// is the decision, the one `minions status` explains a wait with.
bool MayPlace(const Executor& executor, const Job& job, absl::Time now, absl::Duration warm_wait);
// After a grant: the executor becomes busy. False when it already was (nothing to write).
bool MarkBusy(Executor& executor);

// Fair share (model/fair_share.h). The lease query's team order as the JSON object it binds
// ({"team": rank}; a team left out ranks 0, a team at its running-task quota -1, not served).
std::string FairShareRanksJson(const std::vector<TeamUsage>& teams);
// How many more tasks each team with a running-task quota may be granted now (teams without one
// are absent: no limit).
std::map<std::string, int64_t> RunningAllowances(const std::vector<TeamUsage>& teams);
// Whether a grant to `team` fits its allowance; takes one from it if so.
bool TakeAllowance(std::map<std::string, int64_t>& allowances, const std::string& team);
// The wall time to charge for a change of a task from `before` to `after` at `now`: its current
// attempt's when it left `running` (completed, failed, requeued, expired, or made a shadow by a
// backup request) or was replaced by its shadow, and a shadow's time since it became one when it
// wins (completes the task). A shadow that loses or is dropped adds nothing after the backup
// request: the store cannot tell a straggler that ran on from one whose machine died (a backup
// is most often requested because its executor's connection closed), and charging the race's
// whole length for a dead machine would bill the team twice. The time of one device: the stores
// charge it as DeviceTime.
//
// An executor runs one attempt at a time but holds more (its prefetched tasks wait in its queue
// from their lease), so an attempt's lease is not when it started to run. Where the caller knows
// when each executor's time was last charged (`charged`: by executor id, when the last attempt of
// it that was charged ended), an attempt is charged only from then on, and the map moves to `now`
// for each executor charged: the attempts of one executor are then charged disjoint spans, never
// more in all than the wall time since its first lease. The server's clock sets every bound; an
// executor can only choose which of its attempts a span is charged to by the order of its reports,
// never make the span longer (issue 41, point 2).
using ChargedUntil = std::map<std::string, absl::Time>;
absl::Duration EndedAttemptTime(const Task& before, const Task& after, absl::Time now,
                                ChargedUntil* charged = nullptr);
// How many executors each attempt of the job's tasks holds: a gang job's gang size, else one.
// (The PostgreSQL store's charging statements say the same in SQL: GREATEST(gang_size, 1).)
int64_t DevicesPerAttempt(const JobSpec& spec);
// `wall` (EndedAttemptTime) as the device time charged to the job and its team: whole
// microseconds (as stored) times DevicesPerAttempt.
absl::Duration DeviceTime(absl::Duration wall, const JobSpec& spec);

// CompleteTask(s): the fenced completion of one report.
absl::Status CompleteReport(Task& task, const std::string& executor_id, const LeaseProgress& report, absl::Time now);

// MarkLostExecutors.
void MarkLost(Executor& executor);

// --- models (ModelStore) ---

// AddModel: a row's shape before it is stored (InvalidArgument otherwise): a team, a valid name
// and digest, a size, a blob key.
absl::Status CheckNewModel(const ModelRecord& model);
// GetModel/RemoveModel: what to look for (InvalidArgument for a malformed name or digest, or
// neither given).
absl::Status CheckModelQuery(const std::string& name, const std::string& digest);
// RemoveModel: FailedPrecondition, naming the job, when one of `jobs` (the team's jobs that have
// not ended and need `digest`) names the model `name`.
absl::Status CheckModelUnused(const std::string& name, const std::string& digest, const std::vector<Job>& jobs);

// --- identities (IdentityStore) ---

// IdentityStore::ChargeTeamBytes on the team's row: adds `delta` to its count of `kind` (never
// below 0); with `enforce`, ResourceExhausted (team unchanged) when a positive delta takes the
// count past the team's limit (0: none), naming the limit and the verb that raises it.
absl::Status ChargeTeamBytes(Team& team, TeamBytes kind, int64_t delta, bool enforce);

// CreateJob: a team may have at most `team.max_active_jobs` jobs that have not ended (0: no
// limit); `active` is how many it has. ResourceExhausted, saying so, when one more is too many.
// A team without a row (older stores, or names an admin used before teams existed) has no limit.
absl::Status CheckJobQuota(const std::optional<Team>& team, int64_t active);

// AddToken: a credential's shape before it is stored (InvalidArgument otherwise): an id, a hash,
// a team exactly for team roles, uses only for join tokens.
absl::Status CheckNewToken(const TokenRecord& token);

// RevokeToken: revoked now, unless it already was (the first time stays).
void RevokeToken(TokenRecord& token, absl::Time now);

// EnrolExecutor: takes one use of a join token (Unauthenticated unless it is a usable join token).
absl::Status TakeJoinUse(TokenRecord& join, absl::Time now);

// EnrolExecutor where approval is required: the new executor is pending (no leases; sticky).
void AwaitApproval(Executor& executor);
// ApproveExecutor: pending -> available (FailedPrecondition for any other state).
absl::Status ApproveExecutor(Executor& executor);

// RevokeExecutor: the executor becomes revoked. Then, per task it holds: a running attempt of its
// is handed back (preempted: pending at once, not counted; committed chunks stay), and a shadow
// of its is dropped. Returns whether `task` changed.
void RevokeExecutor(Executor& executor);
bool HandBack(Task& task, const std::string& executor_id, int max_attempts, const RetryPolicy& policy, absl::Time now);

}  // namespace minions::store_rules

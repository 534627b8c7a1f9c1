#include "store/common/row_metadata_store.h"

#include <utility>

#include "common/status_macros.h"
#include "store/common/attempt_operations.h"
#include "store/common/executor_operations.h"
#include "store/common/gang_operations.h"
#include "store/common/id_generator.h"
#include "store/common/identity_operations.h"
#include "store/common/job_operations.h"
#include "store/common/job_settler.h"
#include "store/common/lease_operations.h"
#include "store/common/model_operations.h"
#include "store/common/schema_migrator.h"
#include "store/common/verification_operations.h"
#include "store/row_store.h"

namespace minions {

// The operations, each over the one RowStore.
struct RowMetadataStore::Parts {
  Parts(RowStore& rows, const StoreOptions& options)
      : settler(rows),
        migrator(rows),
        jobs(rows, ids, settler),
        attempts(rows, options, settler),
        leases(rows, options),
        executors(rows, options, ids),
        identity(rows, options, ids),
        models(rows),
        gangs(rows),
        verifications(rows, options) {}

  IdGenerator ids;
  JobSettler settler;
  SchemaMigrator migrator;
  JobOperations jobs;
  AttemptOperations attempts;
  LeaseOperations leases;
  ExecutorOperations executors;
  IdentityOperations identity;
  ModelOperations models;
  GangOperations gangs;
  VerificationOperations verifications;
};

RowMetadataStore::RowMetadataStore(std::unique_ptr<RowStore> rows, const StoreOptions& options)
    : options_(options), rows_(std::move(rows)), parts_(std::make_unique<Parts>(*rows_, options_)) {}

RowMetadataStore::~RowMetadataStore() = default;

absl::Status RowMetadataStore::Migrate() { return parts_->migrator.Migrate(); }

absl::StatusOr<int> RowMetadataStore::SchemaVersion() { return parts_->migrator.SchemaVersion(); }

int64_t RowMetadataStore::ConflictsRetried() const { return rows_->ConflictsRetried(); }

// --- delegated to the parts ---

absl::StatusOr<Job> RowMetadataStore::CreateJob(const JobSpec& spec, absl::Time now) {
  return parts_->jobs.CreateJob(spec, now);
}

absl::Status RowMetadataStore::AddTasks(const std::string& job_id, const std::vector<Task>& tasks,
                                        int64_t total_records, absl::Time now) {
  return parts_->jobs.AddTasks(job_id, tasks, total_records, now);
}

absl::StatusOr<Job> RowMetadataStore::GetJob(const std::string& job_id) { return parts_->jobs.GetJob(job_id); }

absl::StatusOr<std::vector<Job>> RowMetadataStore::ListJobs(const JobFilter& filter) {
  return parts_->jobs.ListJobs(filter);
}

absl::StatusOr<std::vector<Task>> RowMetadataStore::ListTasks(const std::string& job_id) {
  return parts_->jobs.ListTasks(job_id);
}

absl::StatusOr<Task> RowMetadataStore::GetTask(const std::string& job_id, int64_t task_index) {
  return parts_->jobs.GetTask(job_id, task_index);
}

absl::StatusOr<std::vector<Task>> RowMetadataStore::GetTasks(const std::vector<std::pair<std::string, int64_t>>& keys) {
  return parts_->jobs.GetTasks(keys);
}

absl::StatusOr<TaskStateCounts> RowMetadataStore::CountTasks(const std::string& job_id) {
  return parts_->jobs.CountTasks(job_id);
}

absl::StatusOr<bool> RowMetadataStore::AnyTaskPending() { return parts_->jobs.AnyTaskPending(); }

absl::StatusOr<Job> RowMetadataStore::CancelJob(const std::string& job_id, absl::Time now) {
  return parts_->jobs.EndJob(job_id, JobState::kCancelled, "", now);
}

absl::StatusOr<Job> RowMetadataStore::FailJob(const std::string& job_id, const std::string& error, absl::Time now) {
  return parts_->jobs.EndJob(job_id, JobState::kFailed, error, now);
}

absl::StatusOr<std::vector<Job>> RowMetadataStore::JobsToFinalize(int limit, absl::Time now) {
  return parts_->jobs.JobsToFinalize(limit, now);
}

absl::StatusOr<Job> RowMetadataStore::ExpireJob(const std::string& job_id, absl::Time now) {
  return parts_->jobs.ExpireJob(job_id, now);
}

absl::StatusOr<Task> RowMetadataStore::RequestBackup(const std::string& job_id, int64_t task_index, int attempt,
                                                     absl::Time now) {
  return parts_->jobs.RequestBackup(job_id, task_index, attempt, now);
}

absl::StatusOr<std::vector<Task>> RowMetadataStore::ListRunningTasks() { return parts_->jobs.ListRunningTasks(); }

absl::StatusOr<Executor> RowMetadataStore::RegisterExecutor(const std::string& executor_id, const ExecutorInfo& info,
                                                            absl::Time now) {
  return parts_->executors.RegisterExecutor(executor_id, info, now);
}

absl::StatusOr<Executor> RowMetadataStore::GetExecutor(const std::string& executor_id) {
  return parts_->executors.GetExecutor(executor_id);
}

absl::StatusOr<std::vector<Executor>> RowMetadataStore::ListExecutors() { return parts_->executors.ListExecutors(); }

absl::StatusOr<std::vector<HeartbeatReply>> RowMetadataStore::Heartbeats(const std::vector<HeartbeatCall>& calls,
                                                                         absl::Duration ttl, absl::Time now) {
  return parts_->executors.Heartbeats(calls, ttl, now);
}

absl::Status RowMetadataStore::RequestDrain(const std::string& executor_id, absl::Time now) {
  return parts_->executors.RequestDrain(executor_id, now);
}

absl::StatusOr<std::vector<Executor>> RowMetadataStore::MarkLostExecutors(absl::Time cutoff, absl::Time now) {
  return parts_->executors.MarkLostExecutors(cutoff, now);
}

absl::StatusOr<std::vector<TeamUsage>> RowMetadataStore::ListTeamUsage(absl::Time now) {
  return parts_->leases.ListTeamUsage(now);
}

absl::StatusOr<std::vector<absl::StatusOr<std::vector<Lease>>>> RowMetadataStore::LeaseMany(
    const std::vector<LeaseAsk>& asks, absl::Duration ttl, absl::Time now) {
  return parts_->leases.LeaseMany(asks, ttl, now);
}

absl::StatusOr<Task> RowMetadataStore::CompleteTask(const std::string& executor_id, const std::string& job_id,
                                                    int64_t task_index, int attempt, int64_t records_done,
                                                    int64_t records_failed, absl::Time now) {
  return parts_->attempts.CompleteTask(executor_id, job_id, task_index, attempt, records_done, records_failed, now);
}

absl::StatusOr<CompletionReply> RowMetadataStore::CompleteMany(const std::vector<CompletionCall>& calls,
                                                               absl::Time now) {
  return parts_->attempts.CompleteMany(calls, now);
}

absl::StatusOr<std::vector<Task>> RowMetadataStore::ExpireLeases(absl::Time now, int limit) {
  return parts_->attempts.ExpireLeases(now, limit);
}

absl::StatusOr<Team> RowMetadataStore::CreateTeam(const Team& team) { return parts_->identity.CreateTeam(team); }

absl::StatusOr<Team> RowMetadataStore::UpdateTeam(const Team& team) { return parts_->identity.UpdateTeam(team); }

absl::StatusOr<Team> RowMetadataStore::GetTeam(const std::string& name) { return parts_->identity.GetTeam(name); }

absl::StatusOr<std::vector<Team>> RowMetadataStore::ListTeams() { return parts_->identity.ListTeams(); }
absl::StatusOr<Team> RowMetadataStore::ChargeTeamBytes(const std::string& team, TeamBytes kind, int64_t delta,
                                                      bool enforce) {
  return parts_->identity.ChargeTeamBytes(team, kind, delta, enforce);
}

absl::Status RowMetadataStore::AddToken(const TokenRecord& token) { return parts_->identity.AddToken(token); }

absl::StatusOr<TokenRecord> RowMetadataStore::FindToken(const std::string& secret_hash) {
  return parts_->identity.FindToken(secret_hash);
}

absl::StatusOr<TokenRecord> RowMetadataStore::GetToken(const std::string& token_id) {
  return parts_->identity.GetToken(token_id);
}

absl::StatusOr<std::vector<TokenRecord>> RowMetadataStore::ListTokens(const TokenFilter& filter) {
  return parts_->identity.ListTokens(filter);
}

absl::StatusOr<TokenRecord> RowMetadataStore::RevokeToken(const std::string& token_id, absl::Time now) {
  return parts_->identity.RevokeToken(token_id, now);
}

absl::Status RowMetadataStore::RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) {
  return parts_->identity.RecordTokenUse(token_ids, at);
}

absl::StatusOr<std::vector<std::string>> RowMetadataStore::RevokedTokensSince(absl::Time since) {
  return parts_->identity.RevokedTokensSince(since);
}

absl::StatusOr<Executor> RowMetadataStore::EnrolExecutor(const std::string& join_secret_hash, TokenRecord& credential,
                                                         const ExecutorInfo& info, absl::Time now,
                                                         bool await_approval) {
  return parts_->identity.EnrolExecutor(join_secret_hash, credential, info, now, await_approval);
}

absl::Status RowMetadataStore::RotateCredential(const std::string& token_id, TokenRecord& fresh, absl::Time now,
                                               absl::Time old_expires_by) {
  return parts_->identity.RotateCredential(token_id, fresh, now, old_expires_by);
}

absl::StatusOr<Executor> RowMetadataStore::ApproveExecutor(const std::string& executor_id, absl::Time now) {
  return parts_->identity.ApproveExecutor(executor_id, now);
}

absl::StatusOr<Executor> RowMetadataStore::RevokeExecutor(const std::string& executor_id, absl::Time now) {
  return parts_->identity.RevokeExecutor(executor_id, now);
}

absl::StatusOr<ModelRecord> RowMetadataStore::AddModel(const ModelRecord& model) {
  return parts_->models.AddModel(model);
}

absl::StatusOr<ModelRecord> RowMetadataStore::GetModel(const std::string& team, const std::string& name,
                                                       const std::string& digest) {
  return parts_->models.GetModel(team, name, digest);
}

absl::StatusOr<std::vector<ModelRecord>> RowMetadataStore::ListModels(const std::string& team) {
  return parts_->models.ListModels(team);
}

absl::StatusOr<RemovedModels> RowMetadataStore::RemoveModel(const std::string& team, const std::string& name,
                                                            const std::string& digest) {
  return parts_->models.RemoveModel(team, name, digest);
}

absl::Status RowMetadataStore::RecordGang(const GangLease& gang) { return parts_->gangs.RecordGang(gang); }

absl::StatusOr<GangLease> RowMetadataStore::GangOf(const std::string& executor_id) {
  return parts_->gangs.GangOf(executor_id);
}

absl::StatusOr<std::vector<GangLease>> RowMetadataStore::ListGangs() { return parts_->gangs.ListGangs(); }

absl::Status RowMetadataStore::EndGang(const std::string& job_id, int64_t task_index, int attempt) {
  return parts_->gangs.EndGang(job_id, task_index, attempt);
}

absl::StatusOr<std::optional<GangTaskRef>> RowMetadataStore::NextGangTask(absl::Time now) {
  return parts_->gangs.NextGangTask(now);
}

absl::StatusOr<Lease> RowMetadataStore::LeaseToGang(const GangLease& gang, absl::Duration ttl, absl::Time now) {
  return parts_->gangs.LeaseToGang(gang, ttl, now);
}

absl::StatusOr<Job> RowMetadataStore::FinishJob(const std::string& job_id, const std::string& output_key,
                                                const std::string& errors_key, const std::string& manifest_key,
                                                absl::Time now, JobState outcome, const TokenUsage& tokens) {
  return parts_->jobs.FinishJob(job_id, output_key, errors_key, manifest_key, now, outcome, tokens);
}

absl::StatusOr<Task> RowMetadataStore::FailTask(const std::string& executor_id, const std::string& job_id,
                                                int64_t task_index, int attempt, FailureClass failure,
                                                const std::string& message, absl::Time now,
                                                const std::vector<Chunk>& chunks) {
  return parts_->attempts.FailTask(executor_id, job_id, task_index, attempt, failure, message, now, chunks);
}

// --- this class's own ---

absl::StatusOr<HeartbeatReply> RowMetadataStore::Heartbeat(const std::string& executor_id, ExecutorState state,
                                                           const std::string& reason,
                                                           const std::vector<LeaseProgress>& held, absl::Duration ttl,
                                                           absl::Time now,
                                                           const std::optional<ModelHoldings>& holdings) {
  ASSIGN_OR_RETURN(std::vector<HeartbeatReply> replies,
                   Heartbeats({HeartbeatCall{executor_id, state, reason, held, holdings}}, ttl, now));
  return std::move(replies.front());
}

absl::StatusOr<std::vector<Lease>> RowMetadataStore::LeaseTasks(const std::string& executor_id, int max_tasks,
                                                                absl::Duration ttl, absl::Time now) {
  ASSIGN_OR_RETURN(auto answers, LeaseMany({LeaseAsk{executor_id, max_tasks}}, ttl, now));
  if (answers.size() != 1) return absl::InternalError("the store answered no lease");
  return std::move(answers.front());
}

absl::Status RowMetadataStore::ClaimObjectStore(const std::string& identity, absl::Time now) {
  return RunTransaction(*rows_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::Status {
    RETURN_IF_ERROR(t.InsertSettingIfAbsent(kObjectStoreSetting, identity, now));
    ASSIGN_OR_RETURN(std::string recorded, t.Setting(kObjectStoreSetting));
    return CheckObjectStore(recorded, identity);
  });
}

absl::StatusOr<std::string> RowMetadataStore::RecordedObjectStore() {
  return RunTransaction(*rows_, TransactionKind::kRead,
                        [&](RowTransaction& t) { return t.Setting(kObjectStoreSetting); });
}

absl::Status RowMetadataStore::RecordFleetHistory(const FleetHistoryRow& row, absl::Time keep_after) {
  return RunTransaction(*rows_, TransactionKind::kWrite,
                        [&](RowTransaction& t) { return t.InsertFleetHistory(row, keep_after); });
}

absl::StatusOr<std::vector<FleetHistoryRow>> RowMetadataStore::ListFleetHistory(absl::Time since) {
  return RunTransaction(*rows_, TransactionKind::kRead, [&](RowTransaction& t) { return t.ListFleetHistory(since); });
}

absl::Status RowMetadataStore::AddFleetTokens(absl::Time at, const std::map<std::string, TokenUsage>& tokens,
                                              absl::Time keep_after) {
  return RunTransaction(*rows_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::Status {
    for (const auto& [team, used] : tokens) RETURN_IF_ERROR(t.AddFleetTokens(at, team, used));
    return t.PruneFleetTokens(keep_after);
  });
}

absl::StatusOr<std::vector<FleetTokensRow>> RowMetadataStore::ListFleetTokens(absl::Time since) {
  return RunTransaction(*rows_, TransactionKind::kRead, [&](RowTransaction& t) { return t.ListFleetTokens(since); });
}

absl::Status RowMetadataStore::RecordThroughput(const ThroughputKey& key, const ThroughputSample& sample,
                                                absl::Time now) {
  return RunTransaction(*rows_, TransactionKind::kWrite,
                        [&](RowTransaction& t) { return t.AddThroughputSample(key, sample, now); });
}

absl::StatusOr<std::optional<Throughput>> RowMetadataStore::GetThroughput(const ThroughputKey& key) {
  return RunTransaction(*rows_, TransactionKind::kRead, [&](RowTransaction& t) { return t.GetThroughput(key); });
}

absl::StatusOr<Executor> RowMetadataStore::RecordVerification(const Verification& verification, absl::Time now) {
  return parts_->verifications.RecordVerification(verification, now);
}

absl::StatusOr<std::vector<Verification>> RowMetadataStore::ListVerifications(const std::string& job_id) {
  return parts_->verifications.ListVerifications(job_id);
}

absl::StatusOr<Executor> RowMetadataStore::ReleaseExecutor(const std::string& executor_id, absl::Time now) {
  return parts_->verifications.ReleaseExecutor(executor_id, now);
}

absl::StatusOr<std::vector<VerificationTask>> RowMetadataStore::LeaseVerifications(const std::string& executor_id,
                                                                                   int max_tasks, absl::Duration ttl,
                                                                                   absl::Time now) {
  return parts_->verifications.LeaseVerifications(executor_id, max_tasks, ttl, now);
}

absl::StatusOr<VerificationTask> RowMetadataStore::GetVerificationTask(const VerificationTask& key) {
  return parts_->verifications.GetVerificationTask(key);
}

absl::StatusOr<Executor> RowMetadataStore::ReportVerifications(const std::string& verifier_id,
                                                               const VerificationTask& key,
                                                               const std::vector<RecordVerdict>& verdicts,
                                                               absl::Time now) {
  return parts_->verifications.ReportVerifications(verifier_id, key, verdicts, now);
}

absl::StatusOr<int64_t> RowMetadataStore::CountOpenVerifications(const std::string& job_id) {
  return parts_->verifications.CountOpenVerifications(job_id);
}

}  // namespace minions

#pragma once
// RowMetadataStore: the MetadataStore (with its IdentityStore, ModelStore and GangStore halves)
// written once over a RowStore (store/row_store.h), the rows of one backend. Each operation's
// orchestration — load the rows (for update), apply the pure rule (model/state_machines.h,
// store/common/store_rules.h), save — is in one of its parts, each a class of its own in
// store/common/:
//
//   JobOperations        jobs and tasks: create, read, cancel, fail, expire, finish, backups
//   AttemptOperations    completions, failures, expired leases (fenced; they end attempts)
//   LeaseOperations      leasing (several executors' calls in one transaction), team usage
//   ExecutorOperations   registration, heartbeats, drains, lost executors
//   IdentityOperations   teams, credentials, enrolment, revocation
//   ModelOperations      the model registry
//   GangOperations       gang seats, gang leasing
//   VerificationOperations  verifiers' verdicts, quarantine and release
//   JobSettler           ending attempts and settling the jobs whose last task ended
//   SchemaMigrator       the schema's migrations
//
// and this class owns them and answers for them; the object store's claim and task sizes, a
// statement each, are its own. A backend is a RowStore: SqliteMetadataStore and
// PostgresMetadataStore are this class over theirs (store/sqlite/, store/postgres/).
// Owns the RowStore and the parts. Thread-safe, as the RowStore is.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/metadata_store.h"

namespace minions {

class RowStore;  // store/row_store.h

class RowMetadataStore : public MetadataStore {
 public:
  // A store over `rows`; call Migrate before anything else.
  RowMetadataStore(std::unique_ptr<RowStore> rows, const StoreOptions& options);
  ~RowMetadataStore() override;
  RowMetadataStore(const RowMetadataStore&) = delete;
  RowMetadataStore& operator=(const RowMetadataStore&) = delete;

  // Applies the schema migrations the database lacks (SchemaMigrator).
  absl::Status Migrate();
  // The schema version of the database (the highest migration applied).
  absl::StatusOr<int> SchemaVersion();

  absl::Duration WarmWait() const override { return options_.EffectiveWarmWait(); }
  int64_t ConflictsRetried() const override;

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
  absl::StatusOr<Job> ExpireJob(const std::string& job_id, absl::Time now) override;
  absl::StatusOr<Task> RequestBackup(const std::string& job_id, int64_t task_index, int attempt,
                                     absl::Time now) override;
  absl::StatusOr<std::vector<Task>> ListRunningTasks() override;
  absl::StatusOr<Executor> RegisterExecutor(const std::string& executor_id, const ExecutorInfo& info,
                                            absl::Time now) override;
  absl::StatusOr<Executor> GetExecutor(const std::string& executor_id) override;
  absl::StatusOr<std::vector<Executor>> ListExecutors() override;
  absl::StatusOr<std::vector<HeartbeatReply>> Heartbeats(const std::vector<HeartbeatCall>& calls, absl::Duration ttl,
                                                         absl::Time now) override;
  absl::Status RequestDrain(const std::string& executor_id, absl::Time now) override;
  absl::StatusOr<std::vector<Executor>> MarkLostExecutors(absl::Time cutoff, absl::Time now) override;
  absl::StatusOr<std::vector<TeamUsage>> ListTeamUsage(absl::Time now) override;
  absl::StatusOr<std::vector<absl::StatusOr<std::vector<Lease>>>> LeaseMany(const std::vector<LeaseAsk>& asks,
                                                                            absl::Duration ttl,
                                                                            absl::Time now) override;
  absl::StatusOr<Task> CompleteTask(const std::string& executor_id, const std::string& job_id, int64_t task_index,
                                    int attempt, int64_t records_done, int64_t records_failed, absl::Time now) override;
  absl::StatusOr<CompletionReply> CompleteMany(const std::vector<CompletionCall>& calls, absl::Time now) override;
  absl::StatusOr<std::vector<Task>> ExpireLeases(absl::Time now, int limit) override;
  absl::StatusOr<Team> CreateTeam(const Team& team) override;
  absl::StatusOr<Team> UpdateTeam(const Team& team) override;
  absl::StatusOr<Team> GetTeam(const std::string& name) override;
  absl::StatusOr<std::vector<Team>> ListTeams() override;
  absl::StatusOr<Team> ChargeTeamBytes(const std::string& team, TeamBytes kind, int64_t delta,
                                       bool enforce) override;
  absl::Status AddToken(const TokenRecord& token) override;
  absl::StatusOr<TokenRecord> FindToken(const std::string& secret_hash) override;
  absl::StatusOr<TokenRecord> GetToken(const std::string& token_id) override;
  absl::StatusOr<std::vector<TokenRecord>> ListTokens(const TokenFilter& filter) override;
  absl::StatusOr<TokenRecord> RevokeToken(const std::string& token_id, absl::Time now) override;
  absl::Status RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) override;
  absl::StatusOr<std::vector<std::string>> RevokedTokensSince(absl::Time since) override;
  absl::StatusOr<Executor> EnrolExecutor(const std::string& join_secret_hash, TokenRecord& credential,
                                         const ExecutorInfo& info, absl::Time now, bool await_approval) override;
  absl::StatusOr<Executor> RevokeExecutor(const std::string& executor_id, absl::Time now) override;
  absl::StatusOr<Executor> ApproveExecutor(const std::string& executor_id, absl::Time now) override;
  absl::Status RotateCredential(const std::string& token_id, TokenRecord& fresh, absl::Time now,
                                absl::Time old_expires_by) override;
  absl::StatusOr<ModelRecord> AddModel(const ModelRecord& model) override;
  absl::StatusOr<ModelRecord> GetModel(const std::string& team, const std::string& name,
                                       const std::string& digest) override;
  absl::StatusOr<std::vector<ModelRecord>> ListModels(const std::string& team) override;
  absl::StatusOr<RemovedModels> RemoveModel(const std::string& team, const std::string& name,
                                            const std::string& digest) override;
  absl::Status RecordGang(const GangLease& gang) override;
  absl::StatusOr<GangLease> GangOf(const std::string& executor_id) override;
  absl::StatusOr<std::vector<GangLease>> ListGangs() override;
  absl::Status EndGang(const std::string& job_id, int64_t task_index, int attempt) override;
  absl::StatusOr<std::optional<GangTaskRef>> NextGangTask(absl::Time now) override;
  absl::StatusOr<Lease> LeaseToGang(const GangLease& gang, absl::Duration ttl, absl::Time now) override;
  absl::StatusOr<Job> FinishJob(const std::string& job_id, const std::string& output_key, const std::string& errors_key,
                                const std::string& manifest_key, absl::Time now,
                                JobState outcome = JobState::kCompleted, const TokenUsage& tokens = {}) override;
  absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& executor_id, ExecutorState state,
                                           const std::string& reason, const std::vector<LeaseProgress>& held,
                                           absl::Duration ttl, absl::Time now,
                                           const std::optional<ModelHoldings>& holdings = std::nullopt) override;
  absl::StatusOr<std::vector<Lease>> LeaseTasks(const std::string& executor_id, int max_tasks, absl::Duration ttl,
                                                absl::Time now) override;
  absl::StatusOr<Task> FailTask(const std::string& executor_id, const std::string& job_id, int64_t task_index,
                                int attempt, FailureClass failure, const std::string& message, absl::Time now,
                                const std::vector<Chunk>& chunks = {}) override;
  absl::Status ClaimObjectStore(const std::string& identity, absl::Time now) override;
  absl::StatusOr<std::string> RecordedObjectStore() override;
  absl::Status RecordThroughput(const ThroughputKey& key, const ThroughputSample& sample, absl::Time now) override;
  absl::StatusOr<std::optional<Throughput>> GetThroughput(const ThroughputKey& key) override;
  absl::Status RecordFleetHistory(const FleetHistoryRow& row, absl::Time keep_after) override;
  absl::StatusOr<std::vector<FleetHistoryRow>> ListFleetHistory(absl::Time since) override;
  absl::Status AddFleetTokens(absl::Time at, const std::map<std::string, TokenUsage>& tokens,
                              absl::Time keep_after) override;
  absl::StatusOr<std::vector<FleetTokensRow>> ListFleetTokens(absl::Time since) override;
  absl::StatusOr<Executor> RecordVerification(const Verification& verification, absl::Time now) override;
  absl::StatusOr<std::vector<Verification>> ListVerifications(const std::string& job_id) override;
  absl::StatusOr<Executor> ReleaseExecutor(const std::string& executor_id, absl::Time now) override;
  absl::StatusOr<std::vector<VerificationTask>> LeaseVerifications(const std::string& executor_id, int max_tasks,
                                                                   absl::Duration ttl, absl::Time now) override;
  absl::StatusOr<VerificationTask> GetVerificationTask(const VerificationTask& key) override;
  absl::StatusOr<Executor> ReportVerifications(const std::string& verifier_id, const VerificationTask& key,
                                               const std::vector<RecordVerdict>& verdicts, absl::Time now) override;
  absl::StatusOr<int64_t> CountOpenVerifications(const std::string& job_id) override;

 private:
  struct Parts;  // the operations (row_metadata_store.cc)

  const StoreOptions options_;
  const std::unique_ptr<RowStore> rows_;
  const std::unique_ptr<Parts> parts_;
};

}  // namespace minions

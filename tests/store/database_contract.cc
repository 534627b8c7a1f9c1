// The database contract (database_contract.h): migrations, reopening, several stores on one
// database.

#include "database_contract.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gang_store_contract.h"

namespace minions {
namespace {

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DatabaseContract);

// What each migration added, undone; newest first. Statements for one dialect name it.
struct Undo {
  int migration;
  const char* sql;
  std::optional<store_common::SqlDialect> only = std::nullopt;
};
constexpr store_common::SqlDialect kSqlite = store_common::SqlDialect::kSqlite;
const Undo kUndo[] = {
    {23, "ALTER TABLE teams DROP COLUMN verify_ppm"},
    {23, "ALTER TABLE verification_tasks DROP COLUMN disputed_verifier"},
    {23, "ALTER TABLE verification_tasks DROP COLUMN chunk_begin"},
    {23, "ALTER TABLE verification_tasks DROP COLUMN chunk_end"},
    {22, "ALTER TABLE teams DROP COLUMN runners"},
    {22, "ALTER TABLE teams DROP COLUMN require_confined"},
    {21, "ALTER TABLE jobs DROP COLUMN reasoning_tokens"},
    {20, "ALTER TABLE executors DROP COLUMN charged_until"},
    {19, "ALTER TABLE teams DROP COLUMN max_file_bytes"},
    {19, "ALTER TABLE teams DROP COLUMN max_model_bytes"},
    {19, "ALTER TABLE teams DROP COLUMN max_result_bytes"},
    {19, "ALTER TABLE teams DROP COLUMN file_bytes"},
    {19, "ALTER TABLE teams DROP COLUMN result_bytes"},
    {18, "DROP TABLE fleet_tokens"},
    {17, "DROP TABLE verification_tasks"},
    {16, "DROP TABLE fleet_history"},
    {15, "DROP TABLE verifications"},
    {14, "ALTER TABLE jobs DROP COLUMN prompt_tokens"},
    {14, "ALTER TABLE jobs DROP COLUMN completion_tokens"},
    // SQLite refuses to drop a column its trigger names (migration 13 makes the trigger again);
    // PostgreSQL's trigger function is replaced by migration 13 as it is.
    {13, "DROP TRIGGER tasks_running_by_team", kSqlite},
    {13, "ALTER TABLE team_usage DROP COLUMN running_devices"},
    {13, "ALTER TABLE team_usage DROP COLUMN running_device_since_us"},
};

}  // namespace

std::vector<std::string> UndoMigrations(int version, store_common::SqlDialect dialect) {
  std::vector<std::string> statements;
  for (const Undo& undo : kUndo) {
    if (undo.migration > version && (!undo.only || *undo.only == dialect)) statements.push_back(undo.sql);
  }
  return statements;
}

namespace {

TEST_P(DatabaseContract, TheUndoListUndoesEveryMigrationSinceTwelve) {
  // The upgrade tests go back to 12 and to 20: each migration since must be undone in kUndo.
  for (int version = 13; version <= LatestVersion(); ++version) {
    EXPECT_TRUE(std::any_of(std::begin(kUndo), std::end(kUndo), [&](const Undo& u) { return u.migration == version; }))
        << "migration " << version << " is not undone in database_contract.cc's kUndo";
  }
}

TEST_P(DatabaseContract, MigrationsAreAppliedOnce) {
  for (int i = 0; i < 3; ++i) {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(int version, store->SchemaVersion());
    EXPECT_EQ(version, LatestVersion());
  }
  EXPECT_EQ(database_.count("SELECT COUNT(*) FROM schema_migrations"),
            static_cast<int64_t>(Migrations().size()));
  EXPECT_EQ(database_.count("SELECT MAX(version) FROM schema_migrations"), LatestVersion());
}

TEST_P(DatabaseContract, MigrationVersionsAreContiguous) {
  int expected = 1;
  for (const store_common::Migration& migration : Migrations()) {
    EXPECT_EQ(migration.version, expected++) << migration.description;
  }
}

// A migration that has landed keeps its number for good: a database that applied it under that
// number would otherwise skip its replacement and apply it again under the next (as happened when
// gang seats landed as 7 and were renumbered 8 on a branch: "table gang_seats already exists").
// Append landed migrations here as they land.
TEST_P(DatabaseContract, LandedMigrationsKeepTheirNumbers) {
  const std::vector<std::string> landed = {"initial schema", "", "task checkpoints", "identities", "the model registry",
                                           "fair share", "gangs", "settings", "gang jobs", "task sizes",
                                           "accounting: each team's device time", "accounting: each job's device time",
                                           "accounting: a gang attempt's running time",
                                           "accounting: the tokens a finished job's answers used"};
  ASSERT_GE(Migrations().size(), landed.size());
  for (size_t i = 0; i < landed.size(); ++i) {
    if (landed[i].empty()) continue;  // (2 differs by backend)
    EXPECT_TRUE(absl::StartsWith(Migrations()[i].description, landed[i]))
        << "migration " << i + 1 << " was \"" << landed[i] << "...\" when it landed, is now \""
        << Migrations()[i].description << "\"";
  }
}

TEST_P(DatabaseContract, ServersOpeningAtOnceMigrateOnce) {
  constexpr int kServers = 4;
  std::vector<std::unique_ptr<RowMetadataStore>> stores(kServers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kServers; ++i) threads.emplace_back([&, i] { stores[i] = Open(); });
  for (std::thread& thread : threads) thread.join();
  for (const auto& store : stores) ASSERT_NE(store, nullptr);
  EXPECT_EQ(database_.count("SELECT COUNT(*) FROM schema_migrations"),
            static_cast<int64_t>(Migrations().size()));
  // They all work on the one database.
  const std::string job_id = SubmitTo(*stores[0], 2, now_);
  ASSERT_OK_AND_ASSIGN(Job job, stores[kServers - 1]->GetJob(job_id));
  EXPECT_EQ(job.state, JobState::kQueued);
}

TEST_P(DatabaseContract, ANewerSchemaIsRefused) {
  { ASSERT_NE(Open(), nullptr); }
  ASSERT_EQ(database_.exec(absl::StrCat("INSERT INTO schema_migrations (version, applied_at) VALUES (",
                                        LatestVersion() + 1, ", '2099-01-01')")),
            "");
  absl::StatusOr<std::unique_ptr<RowMetadataStore>> store = database_.open();
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("newer"));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(absl::StrCat("schema version ", LatestVersion() + 1)));
}

// Migration 13 on a database where a gang attempt runs: from then on that attempt counts once per
// executor it holds in its team's usage, as attempts begun after the upgrade do.
TEST_P(DatabaseContract, UpgradingCountsARunningGangAttemptOncePerExecutor) {
  if (!database_.can_drop_columns) GTEST_SKIP() << "this backend's library cannot undo migrations 13 and 14";
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_OK(RunAGangOfThreeAndOneSingleTask(*store, now_, kTtl));
  }
  // The database as schema 12 had it: no device columns (running and running_since_us are as
  // they were, and a server of the previous release still reads them so).
  UndoTo(12);
  if (HasFatalFailure()) return;

  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<TeamUsage> teams, store->ListTeamUsage(now_ + absl::Seconds(10)));
  ASSERT_THAT(teams, SizeIs(1));
  EXPECT_EQ(teams[0].running, 2);
  EXPECT_EQ(teams[0].usage, absl::Seconds(40)) << "the gang's 3 executors and the single one, 10 s each";
  // What a server of the previous release reads is as it was: two running tasks' starts.
  EXPECT_EQ(database_.count("SELECT CAST(running_since_us AS BIGINT) FROM team_usage"), 2 * absl::ToUnixMicros(now_));
}

// Migration 21 on a database where a job finished under schema 20 (its prompt and completion
// tokens kept, reasoning not apart): the job keeps its tokens, with 0 reasoning, and a job that
// finishes after the upgrade keeps its reasoning tokens too.
TEST_P(DatabaseContract, UpgradingTo21KeepsAFinishedJobsTokensWithNoReasoning) {
  if (!database_.can_drop_columns) GTEST_SKIP() << "this backend's library cannot undo migration 21";
  std::string old_job;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    old_job = SubmitTo(*store, 1, now_);
  }
  UndoTo(20);
  if (HasFatalFailure()) return;
  // What a server of schema 20 wrote when the job finished.
  ASSERT_EQ(database_.exec(absl::StrCat("UPDATE jobs SET prompt_tokens = 70, completion_tokens = 9 WHERE id = '",
                                        old_job, "'")),
            "");

  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(Job job, store->GetJob(old_job));
  EXPECT_EQ(job.tokens, (TokenUsage{.prompt_tokens = 70, .completion_tokens = 9, .reasoning_tokens = 0}));
  const std::string new_job = SubmitTo(*store, 1, now_);
  const std::string executor = RegisterWith(*store, "a", now_);
  ASSERT_OK(store->LeaseTasks(executor, 2, kTtl, now_));  // the old job's task and the new one's
  ASSERT_OK(store->CompleteTask(executor, new_job, 0, 1, 1, 0, now_));
  const TokenUsage tokens{.prompt_tokens = 5, .completion_tokens = 40, .reasoning_tokens = 30};
  ASSERT_OK_AND_ASSIGN(Job finished, store->FinishJob(new_job, "o", "e", "m", now_, JobState::kCompleted, tokens));
  EXPECT_EQ(finished.tokens, tokens);
}

TEST_P(DatabaseContract, ReopeningKeepsTheData) {
  std::string job_id, executor_id;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    job_id = SubmitTo(*store, 3, now_);
    executor_id = RegisterWith(*store, "a", now_);
    ASSERT_OK(store->LeaseTasks(executor_id, 1, kTtl, now_));
  }
  auto reopened = Open();
  ASSERT_NE(reopened, nullptr);
  ASSERT_OK_AND_ASSIGN(Job job, reopened->GetJob(job_id));
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.spec.model, "m.gguf");
  EXPECT_EQ(job.created_at, now_);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, reopened->ListTasks(job_id));
  ASSERT_THAT(tasks, SizeIs(3));
  EXPECT_EQ(tasks[0].state, TaskState::kRunning);
  EXPECT_EQ(tasks[0].executor_id, executor_id);
  EXPECT_EQ(tasks[0].lease_expires_at, now_ + kTtl);
  ASSERT_OK_AND_ASSIGN(Executor executor, reopened->GetExecutor(executor_id));
  EXPECT_EQ(executor.info.name, "a");
  // The lease is still the executor's, fenced as before.
  EXPECT_OK(reopened->CompleteTask(executor_id, job_id, 0, 1, 1, 0, now_));
}

TEST_P(DatabaseContract, TwoStoresOnOneDatabaseSeeEachOthersWrites) {
  // A server and a watchdog process, each with its own connection to the database.
  auto server = Open();
  auto watchdog = Open();
  ASSERT_NE(server, nullptr);
  ASSERT_NE(watchdog, nullptr);

  const std::string job_id = SubmitTo(*server, 1, now_);
  const std::string a = RegisterWith(*server, "a", now_);
  ASSERT_OK_AND_ASSIGN(std::vector<Lease> leases, server->LeaseTasks(a, 1, kTtl, now_));
  ASSERT_THAT(leases, SizeIs(1));

  ASSERT_OK_AND_ASSIGN(Job seen, watchdog->GetJob(job_id));
  EXPECT_EQ(seen.state, JobState::kRunning);

  now_ += absl::Minutes(1);
  ASSERT_OK_AND_ASSIGN(std::vector<Executor> lost, watchdog->MarkLostExecutors(now_ - kTtl, now_));
  EXPECT_THAT(lost, SizeIs(1));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> expired, watchdog->ExpireLeases(now_, 10));
  ASSERT_THAT(expired, SizeIs(1));

  ASSERT_OK_AND_ASSIGN(Executor executor, server->GetExecutor(a));
  EXPECT_EQ(executor.state, ExecutorState::kLost);
  EXPECT_CODE(server->CompleteTask(a, job_id, 0, 1, 1, 0, now_), kFailedPrecondition);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, server->ListTasks(job_id));
  EXPECT_EQ(tasks[0].state, TaskState::kPending);
}

TEST_P(DatabaseContract, TwoStoresOnOneDatabaseNeverGrantATaskTwice) {
  // Two store objects are two servers: no shared memory, one database.
  constexpr int kTasks = 300;
  constexpr int kThreads = 6;
  auto first = Open();
  auto second = Open();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  const std::string job_id = SubmitTo(*first, kTasks, now_);
  std::vector<MetadataStore*> stores;
  std::vector<std::string> executors;
  for (int t = 0; t < kThreads; ++t) {
    stores.push_back(t % 2 == 0 ? first.get() : second.get());
    executors.push_back(RegisterWith(*stores[t], "exe" + std::to_string(t), now_));
  }

  const ConcurrentLeases leases =
      LeaseConcurrently(stores, executors, [](int t) { return 1 + t % 3; }, kTtl, now_);
  EXPECT_EQ(leases.errors, 0);
  std::map<int64_t, int> holder;
  size_t total = 0;
  for (int t = 0; t < kThreads; ++t) {
    total += leases.granted[t].size();
    for (const Lease& lease : leases.granted[t]) {
      EXPECT_TRUE(holder.emplace(lease.task.index, t).second) << "task " << lease.task.index << " twice";
    }
  }
  EXPECT_EQ(total, static_cast<size_t>(kTasks));
  EXPECT_EQ(holder.size(), static_cast<size_t>(kTasks));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, second->ListTasks(job_id));
  for (const Task& task : tasks) {
    EXPECT_EQ(task.state, TaskState::kRunning);
    EXPECT_EQ(task.attempt, 1);
    EXPECT_EQ(task.executor_id, executors[holder[task.index]]);
  }
}

}  // namespace
}  // namespace minions

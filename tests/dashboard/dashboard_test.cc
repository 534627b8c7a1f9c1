// The server's HTTP face on a real loopback port: the store-derived gauges, the dashboard's JSON,
// health and readiness, the compiled-in web files. A SQLite store in memory and a fake clock.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "dashboard/fleet_view.h"
#include "dashboard/status_endpoints.h"
#include "http/http_server.h"
#include "identity/authenticator.h"
#include "identity/identity_admin.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/even_tasks.h"
#include "testing/fake_clock.h"
#include "testing/http_get.h"
#include "testing/identities.h"
#include "testing/must.h"
#include "testing/prometheus_text.h"

namespace minions::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kTtl = absl::Seconds(10);

class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = Must(SqliteMetadataStore::Open(":memory:", StoreOptions{}));
    fleet_ = std::make_unique<FleetView>(store_.get(), &clock_, &progress_, absl::Seconds(1));
    fleet_->ExportMetrics(&registry_);
    auth_ = std::make_unique<Authenticator>(store_.get(), &clock_);
    identities_ = std::make_unique<IdentityAdmin>(store_.get(), &clock_);
    InstallStatusEndpoints({store_.get(), &clock_, fleet_.get(), &progress_, &registry_,
                            [this] { return serving_.load(); }, auth_.get()},
                           &http_);
    ASSERT_TRUE(http_.Start("127.0.0.1:0").ok());
    base_ = absl::StrCat("http://127.0.0.1:", http_.port());
    admin_ = Issue(Role::kAdmin, "", "ops");
  }

  // A fresh token's text.
  std::string Issue(Role role, const std::string& team, const std::string& name) {
    return IssueText(*identities_, role, team, name);
  }
  static std::vector<std::string> Bearer(const std::string& token) { return {"Authorization: Bearer " + token}; }
  void TearDown() override { http_.Stop(); }

  std::string Register(const std::string& name, const std::string& gpu) {
    ExecutorInfo info;
    info.name = name;
    info.chip = "Test CPU";
    info.gpu = gpu;
    info.memory_bytes = int64_t{8} << 30;
    info.runners = {"llama"};
    info.max_tasks = 4;
    return Must(store_->RegisterExecutor("", info, clock_.Now())).id;
  }

  // A job of `n_tasks` tasks of 10 records each, for team "ml".
  std::string Submit(int n_tasks) {
    return Must(QueueEvenJob(*store_, TenRecordSpec("ml", "/models/tiny.gguf"), n_tasks, clock_.Now()));
  }

  std::map<std::string, double> Scrape() {
    HttpReply reply = HttpGet(base_ + "/metrics", 10000, Bearer(admin_));
    EXPECT_EQ(reply.status, 200);
    EXPECT_THAT(reply.content_type, StartsWith("text/plain; version=0.0.4"));
    return ParsePrometheusSamples(reply.body);
  }

  Json GetJson(const std::string& path, long want_status = 200, const std::string& token = "") {
    HttpReply reply = HttpGet(base_ + path, 10000, Bearer(token.empty() ? admin_ : token));
    EXPECT_EQ(reply.status, want_status) << path << ": " << reply.body;
    EXPECT_EQ(reply.content_type, "application/json");
    return Must(ParseJson(reply.body));
  }

  FakeClock clock_;
  std::unique_ptr<SqliteMetadataStore> store_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<IdentityAdmin> identities_;
  std::string admin_;
  metrics::Registry registry_;
  ProgressTracker progress_;
  std::unique_ptr<FleetView> fleet_;
  std::atomic<bool> serving_{true};
  HttpServer http_;
  std::string base_;
};

TEST_F(DashboardTest, AScrapeCountsJobsTasksAndExecutorsByStateFromTheStore) {
  std::string gpu_box = Register("gpu-box", "RTX 4090");
  std::string laptop = Register("laptop", "");
  std::string job = Submit(3);
  clock_.Advance(absl::Seconds(1));  // the older job is leased first
  Submit(2);  // stays queued: all its tasks pending
  std::vector<Lease> leases = Must(store_->LeaseTasks(gpu_box, 1, kTtl, clock_.Now()));
  ASSERT_EQ(leases.size(), 1u);
  // The lease holder reports 4 records done so far; the laptop's owner sat down.
  LeaseProgress progress{job, leases[0].task.index, leases[0].task.attempt, 4, 1};
  ASSERT_TRUE(store_->Heartbeat(gpu_box, ExecutorState::kBusy, "", {progress}, kTtl, clock_.Now()).ok());
  ASSERT_TRUE(store_->Heartbeat(laptop, ExecutorState::kOwnerActive, "keyboard", {}, kTtl, clock_.Now()).ok());
  // An executor whose answer failed a re-scoring is quarantined (docs/verification.md).
  Verification failed;
  failed.job_id = job;
  failed.custom_id = "r0";
  const std::string forger = Register("forger", "");
  failed.producer_id = forger;
  failed.verifier_id = gpu_box;
  failed.reason = "forged";
  ASSERT_TRUE(store_->RecordVerification(failed, clock_.Now()).ok());

  auto s = Scrape();
  EXPECT_EQ(s["minions_store_up"], 1);
  EXPECT_EQ(s.count("minions_store_conflicts_retried_total"), 1u);
  EXPECT_EQ(s["minions_store_conflicts_retried_total"], 0);
  EXPECT_EQ(s["minions_jobs{state=\"running\"}"], 1);
  EXPECT_EQ(s["minions_jobs{state=\"queued\"}"], 1);
  EXPECT_EQ(s["minions_jobs{state=\"completed\"}"], 0);
  EXPECT_EQ(s["minions_tasks{state=\"pending\"}"], 4);  // 2 of the running job, 2 of the queued one
  EXPECT_EQ(s["minions_tasks{state=\"running\"}"], 1);
  EXPECT_EQ(s["minions_executors{state=\"busy\"}"], 1);
  EXPECT_EQ(s["minions_executors{state=\"owner_active\"}"], 1);
  EXPECT_EQ(s["minions_executors{state=\"lost\"}"], 0);
  EXPECT_EQ(s["minions_executors{state=\"quarantined\"}"], 1);
  // Executors waiting for approval have their series too (none here: approval is off).
  ASSERT_EQ(s.count("minions_executors{state=\"pending\"}"), 1u);
  EXPECT_EQ(s["minions_executors{state=\"pending\"}"], 0);
  std::string labels = absl::StrCat("job_id=\"", job, "\",team=\"ml\"");
  EXPECT_EQ(s[absl::StrCat("minions_job_records{", labels, ",kind=\"total\"}")], 30);
  EXPECT_EQ(s[absl::StrCat("minions_job_records{", labels, ",kind=\"in_flight\"}")], 4);
  EXPECT_EQ(s[absl::StrCat("minions_job_tasks{", labels, ",state=\"running\"}")], 1);

  // The fleet as the dashboard sees it: device, coarse state, current task. The owner's presence
  // is "unavailable", never why (not even to an admin).
  Json fleet = GetJson("/api/fleet");
  ASSERT_EQ(fleet["executors"].size(), 3u);
  for (const Json& e : fleet["executors"]) {
    EXPECT_FALSE(e.contains("owner"));
    if (e["id"] == forger) {
      // Quarantined, and why: the record that failed and the verifier's reason.
      EXPECT_EQ(e["state"], "quarantined");
      EXPECT_THAT(e["state_reason"].get<std::string>(), ::testing::HasSubstr("forged"));
    } else if (e["id"] == gpu_box) {
      EXPECT_EQ(e["device"], "RTX 4090");
      EXPECT_EQ(e["state"], "busy");
      ASSERT_EQ(e["tasks"].size(), 1u);
      EXPECT_EQ(e["tasks"][0]["job"], job);
      EXPECT_EQ(e["tasks"][0]["records_done"], 4);
    } else {
      EXPECT_EQ(e["device"], "Test CPU");
      EXPECT_EQ(e["state"], "unavailable");
      EXPECT_EQ(e["state_reason"], "");
      EXPECT_TRUE(e["tasks"].empty());
    }
  }
  EXPECT_EQ(fleet["executors_by_state"]["busy"], 1);
  EXPECT_EQ(fleet["executors_by_state"]["unavailable"], 1);
  EXPECT_EQ(fleet["executors_by_state"]["quarantined"], 1);
  EXPECT_EQ(fleet.dump().find("keyboard"), std::string::npos);
}

// Gangs (docs/architecture.md): the fleet table says which executors form which gang and who
// leads it; a viewer of another team sees neither.
TEST_F(DashboardTest, TheFleetShowsWhichExecutorsFormWhichGangAndItsLeader) {
  const std::string lead = Register("lead-box", "");
  const std::string member = Register("member-box", "");
  const std::string idle = Register("idle-box", "");
  const std::string job_id =
      Must(QueueEvenJob(*store_, TenRecordSpec("ml", "/models/tiny.gguf", /*gang_size=*/2), 1, clock_.Now()));
  GangLease gang;
  gang.job_id = job_id;
  gang.task_index = 0;
  gang.members = {{lead, "10.9.0.1:50052", int64_t{8} << 30}, {member, "10.9.0.2:50052", int64_t{8} << 30}};
  ASSERT_TRUE(store_->LeaseToGang(gang, kTtl, clock_.Now()).ok());

  Json fleet = GetJson("/api/fleet");
  ASSERT_EQ(fleet["executors"].size(), 3u);
  for (const Json& e : fleet["executors"]) {
    if (e["id"] == idle) {
      EXPECT_TRUE(e["gang"].is_null());
      continue;
    }
    ASSERT_TRUE(e["gang"].is_object()) << e.dump();
    EXPECT_EQ(e["gang"]["job"], job_id);
    EXPECT_EQ(e["gang"]["attempt"], 1);
    EXPECT_EQ(e["gang"]["size"], 2);
    EXPECT_EQ(e["gang"]["leader"], lead);
    EXPECT_EQ(e["gang"]["leader_name"], "lead-box");
    EXPECT_EQ(e["gang"]["leads"], e["id"] == lead);
  }
  clock_.Advance(absl::Seconds(2));  // past the fleet cache
  Team search;
  search.name = "search";
  ASSERT_TRUE(store_->CreateTeam(search).ok());
  Json other = GetJson("/api/fleet", 200, Issue(Role::kViewer, "search", "someone"));
  for (const Json& e : other["executors"]) EXPECT_TRUE(e["gang"].is_null()) << e.dump();
}

TEST_F(DashboardTest, JobsShowProgressRateAndEta) {
  std::string executor = Register("worker", "");
  std::string job = Submit(2);
  std::vector<Lease> leases = Must(store_->LeaseTasks(executor, 2, kTtl, clock_.Now()));
  ASSERT_EQ(leases.size(), 2u);
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(store_->CompleteTask(executor, job, 0, 1, 10, 2, clock_.Now()).ok());

  Json jobs = GetJson("/api/jobs");
  ASSERT_EQ(jobs["jobs"].size(), 1u);
  const Json& j = jobs["jobs"][0];
  EXPECT_EQ(j["id"], job);
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["records_succeeded"], 8);
  EXPECT_EQ(j["records_failed"], 2);
  EXPECT_DOUBLE_EQ(j["progress"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["records_per_second"].get<double>(), 1.0);  // 10 records in 10 s
  EXPECT_DOUBLE_EQ(j["eta_seconds"].get<double>(), 10.0);

  // One job: its tasks and their errors.
  ASSERT_TRUE(store_->FailTask(executor, job, 1, 1, FailureClass::kRetryable, "runner crashed", clock_.Now()).ok());
  Json detail = GetJson("/api/job?id=" + job);
  EXPECT_EQ(detail["job"]["id"], job);
  ASSERT_EQ(detail["tasks"].size(), 2u);
  EXPECT_EQ(detail["tasks"][0]["state"], "succeeded");
  EXPECT_EQ(detail["tasks"][1]["state"], "pending");
  ASSERT_EQ(detail["errors"].size(), 1u);
  EXPECT_EQ(detail["errors"][0]["task"], 1);
  EXPECT_EQ(detail["errors"][0]["message"], "runner crashed");

  EXPECT_THAT(GetJson("/api/job", 400)["error"].get<std::string>(), HasSubstr("which job"));
  EXPECT_THAT(GetJson("/api/job?id=job-nope", 404)["error"].get<std::string>(), HasSubstr("job-nope"));
}

TEST_F(DashboardTest, ScrapesWithinTheCacheAgeCostNoStoreReadAndLaterOnesSeeChanges) {
  Submit(1);
  EXPECT_EQ(Scrape()["minions_jobs{state=\"queued\"}"], 1);
  Submit(1);
  EXPECT_EQ(Scrape()["minions_jobs{state=\"queued\"}"], 1);  // cached
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(Scrape()["minions_jobs{state=\"queued\"}"], 2);
}

TEST_F(DashboardTest, EndedJobsAreRecountedWhenAJobEnds) {
  std::string job = Submit(1);
  auto before = Scrape();
  EXPECT_EQ(before["minions_jobs{state=\"queued\"}"], 1);
  EXPECT_EQ(before["minions_jobs{state=\"failed\"}"], 0);
  ASSERT_TRUE(store_->FailJob(job, "input unreadable", clock_.Now()).ok());
  clock_.Advance(absl::Seconds(2));  // past the 1 s cache: the job has left the unfinished ones...
  EXPECT_EQ(Scrape()["minions_jobs{state=\"queued\"}"], 0);
  clock_.Advance(absl::Seconds(4));  // ...and 5 s after the last count, well before 30 s, it is counted
  auto after = Scrape();
  EXPECT_EQ(after["minions_jobs{state=\"queued\"}"], 0);
  EXPECT_EQ(after["minions_jobs{state=\"failed\"}"], 1);
  // An ended job stays on the dashboard's list, and leaves the per-job series.
  Json jobs = GetJson("/api/jobs");
  ASSERT_EQ(jobs["jobs"].size(), 1u);
  EXPECT_EQ(jobs["jobs"][0]["state"], "failed");
  EXPECT_EQ(after.count(absl::StrCat("minions_job_records{job_id=\"", job, "\",team=\"ml\",kind=\"total\"}")), 0u);
}

TEST_F(DashboardTest, EachTeamsFairShareStandingIsExported) {
  Team ml;
  ml.name = "ml";
  ml.weight = 3;
  ASSERT_TRUE(store_->CreateTeam(ml).ok());
  // Two executors, one task each (one executor's queued tasks share its time: store_rules
  // EndedAttemptTime).
  const std::vector<std::string> executors = {Register("worker", ""), Register("worker2", "")};
  const std::string job = Submit(2);
  std::vector<Lease> leases;
  for (const std::string& executor : executors) {
    for (Lease& lease : Must(store_->LeaseTasks(executor, 1, kTtl, clock_.Now()))) leases.push_back(std::move(lease));
  }
  ASSERT_EQ(leases.size(), 2u);
  clock_.Advance(absl::Seconds(10));
  auto samples = Scrape();
  EXPECT_EQ(samples["minions_team_running_tasks{team=\"ml\"}"], 2);
  EXPECT_EQ(samples["minions_team_usage_device_seconds{team=\"ml\"}"], 20);  // two attempts, 10 s each
  EXPECT_EQ(samples["minions_team_weight{team=\"ml\"}"], 3);
  EXPECT_EQ(samples["minions_team_target_share{team=\"ml\"}"], 0.75);  // 3 of default's 1 + ml's 3
  // Device time counts ended attempts only: none yet.
  EXPECT_EQ(samples["minions_team_device_seconds_total{team=\"ml\"}"], 0);
  for (const Lease& lease : leases) {
    const Task& task = lease.task;
    ASSERT_TRUE(
        store_->CompleteTask(task.executor_id, job, task.index, task.attempt, task.n_records, 0, clock_.Now()).ok());
  }
  clock_.Advance(absl::Seconds(2));  // past the scrape's cache
  EXPECT_EQ(Scrape()["minions_team_device_seconds_total{team=\"ml\"}"], 20);
}

TEST_F(DashboardTest, TheHistoryKeepsAPointPerStepAndShowsATeamOnlyItsOwn) {
  Team ml;
  ml.name = "ml";
  ASSERT_TRUE(store_->CreateTeam(ml).ok());
  std::string executor = Register("worker", "");
  std::string job = Submit(4);
  JobSpec other;
  other.team = "ads";
  other.model = "/models/tiny.gguf";
  other.input_key = "inputs/in.jsonl";
  Job ads = Must(store_->CreateJob(other, clock_.Now()));
  ASSERT_TRUE(store_->AddTasks(ads.id, EvenTasks(1, 10), 10, clock_.Now()).ok());
  // Three refreshes 15 s apart (a point each), and two within a step of the last (only the
  // newest of them shows, as the live point).
  for (int i = 0; i < 3; ++i) {
    if (i == 1) ASSERT_EQ(Must(store_->LeaseTasks(executor, 1, absl::Hours(1), clock_.Now())).size(), 1u);
    ASSERT_TRUE(fleet_->Get().ok());
    clock_.Advance(absl::Seconds(15));
  }
  ASSERT_TRUE(fleet_->Get().ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(fleet_->Get().ok());

  Json history = GetJson("/api/history");
  ASSERT_EQ(history["t"].size(), 5u);
  EXPECT_EQ(history["executors"]["available"][0], 1);
  EXPECT_EQ(history["executors"]["busy"][1], 1);
  EXPECT_EQ(history["executors"]["busy"][4], 1);
  EXPECT_EQ(history["jobs"].size(), 2u);  // an admin sees every team's jobs
  for (const Json& j : history["jobs"]) EXPECT_EQ(j["records_per_second"].size(), 5u);

  // A team's viewer sees its own job and its own team's usage only.
  Json mine = GetJson("/api/history", 200, Issue(Role::kViewer, "ml", "dash"));
  ASSERT_EQ(mine["jobs"].size(), 1u);
  EXPECT_EQ(mine["jobs"][0]["id"], job);
  for (const Json& t : mine["teams"]) EXPECT_EQ(t["team"], "ml");
  // No credential, no history.
  EXPECT_EQ(HttpGet(base_ + "/api/history").status, 401);
}

// A job that starts and ends between two history points is in the next point (and in the live
// one meanwhile): a short job does not vanish from the rate chart.
TEST_F(DashboardTest, AJobThatRanBetweenTwoHistoryPointsIsInTheNext) {
  ASSERT_TRUE(fleet_->Get().ok());  // a point, before the job
  std::string job = Submit(1);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(fleet_->Get().ok());  // the job seen running, within the step
  ASSERT_TRUE(store_->CancelJob(job, clock_.Now()).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(fleet_->Get().ok());  // ended, still within the step: the live point keeps it
  Json live = GetJson("/api/history");
  ASSERT_EQ(live["jobs"].size(), 1u) << DumpJson(live);
  EXPECT_EQ(live["jobs"][0]["id"], job);
  clock_.Advance(absl::Seconds(15));
  ASSERT_TRUE(fleet_->Get().ok());  // the next point kept
  clock_.Advance(absl::Seconds(15));
  ASSERT_TRUE(fleet_->Get().ok());  // and one more, after which the job is gone from new points
  Json history = GetJson("/api/history");
  // Three points kept (at the starts of their steps) and the newest refresh, later in its step.
  ASSERT_EQ(history["t"].size(), 4u) << DumpJson(history);
  ASSERT_EQ(history["jobs"].size(), 1u) << DumpJson(history);
  const Json& rates = history["jobs"][0]["records_per_second"];
  EXPECT_TRUE(rates[0].is_null());
  EXPECT_FALSE(rates[1].is_null()) << "the point after the job ran has it";
  EXPECT_TRUE(rates[2].is_null());
  EXPECT_TRUE(rates[3].is_null());
}

// The history is the store's: a server started afresh (a new FleetView on the same store) shows
// the points recorded before, with a gap for the time no server ran, not a line drawn across it;
// a point is recorded each step whether or not anyone reads the dashboard.
TEST_F(DashboardTest, TheHistoryOutlivesARestartAndShowsTheTimeNobodyRanAsAGap) {
  std::string executor = Register("worker", "");
  std::string job = Submit(2);
  ASSERT_EQ(Must(store_->LeaseTasks(executor, 1, absl::Hours(1), clock_.Now())).size(), 1u);
  // The server's history thread, three steps; nobody polls.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(fleet_->RecordHistory().ok());
    ASSERT_TRUE(fleet_->RecordHistory().ok());  // within the step: nothing more
    clock_.Advance(absl::Seconds(15));
  }
  ASSERT_EQ(Must(store_->ListFleetHistory(absl::InfinitePast())).size(), 3u);
  // Down for five minutes; a new server on the same store.
  clock_.Advance(absl::Minutes(5));
  ProgressTracker progress;
  FleetView restarted(store_.get(), &clock_, &progress, absl::Seconds(1));
  ASSERT_TRUE(restarted.RecordHistory().ok());
  clock_.Advance(absl::Seconds(15));
  ASSERT_TRUE(restarted.RecordHistory().ok());
  std::vector<FleetHistoryPoint> points = Must(restarted.History());
  // 3 points before, 2 after, and the newest refresh (later in the last step than its point).
  ASSERT_EQ(points.size(), 6u);
  Json history = HistoryJson(points, Caller{"t1", Role::kAdmin, "", "ops", DefaultScopes(Role::kAdmin)},
                             restarted.history_step());
  // The gap between them.
  ASSERT_EQ(history["t"].size(), 7u) << DumpJson(history);
  EXPECT_EQ(history["executors"]["busy"][2], 1);
  EXPECT_TRUE(history["executors"]["busy"][3].is_null()) << DumpJson(history);
  EXPECT_TRUE(history["tasks"]["pending"][3].is_null());
  EXPECT_EQ(history["executors"]["busy"][4], 1);
  EXPECT_EQ(history["tasks"]["pending"][0], 1);
  EXPECT_EQ(history["tasks"]["running"][0], 1);
  // The gap sits one step after the last point before it.
  EXPECT_DOUBLE_EQ(history["t"][3].get<double>() - history["t"][2].get<double>(), 15);
  ASSERT_EQ(history["jobs"].size(), 1u);
  EXPECT_TRUE(history["jobs"][0]["records_per_second"][3].is_null());
  // A team's viewer is not shown the fleet's queue (every team's tasks).
  Json viewer = HistoryJson(points, Caller{"t2", Role::kViewer, "ml", "dash", DefaultScopes(Role::kViewer)},
                            restarted.history_step());
  EXPECT_FALSE(viewer.contains("tasks"));
}

// An executor's page: its state and records per second over time, from the same stored points
// (kept across a round trip through the store's form), with gaps where nobody ran or it was not
// seen, and the count of tasks it ran for admins only.
TEST_F(DashboardTest, AnExecutorsHistoryShowsItsStatesAndRecordsPerSecond) {
  const std::string executor = Register("worker", "");
  const std::string job = Submit(2);
  ASSERT_TRUE(fleet_->RecordHistory().ok());  // available, 0 records
  clock_.Advance(absl::Seconds(15));
  std::vector<Lease> leases = Must(store_->LeaseTasks(executor, 2, absl::Hours(1), clock_.Now()));
  ASSERT_EQ(leases.size(), 2u);
  ASSERT_TRUE(store_->CompleteTask(executor, job, leases[0].task.index, leases[0].task.attempt, 10, 0, clock_.Now()).ok());
  ASSERT_TRUE(fleet_->RecordHistory().ok());  // busy with one task, 10 records in 15 s
  std::vector<FleetHistoryPoint> points = Must(fleet_->History());
  ASSERT_GE(points.size(), 2u);
  // Through the stored form and back: the samples survive.
  FleetHistoryPoint stored = Must(ParseFleetHistoryPoint(points[1].at, FleetHistoryPointJson(points[1])));
  ASSERT_EQ(stored.executors.count(executor), 1u);
  EXPECT_EQ(stored.executors[executor].tasks_running, 1);
  const int64_t records = stored.executors[executor].records_done;
  // Five minutes with no server, then a point where it is gone (revoked).
  FleetHistoryPoint later = stored;
  later.at = stored.at + absl::Minutes(5);
  later.executors.clear();
  std::vector<FleetHistoryPoint> shown = {points[0], stored, later};
  const absl::Duration step = fleet_->history_step();
  Json admin = ExecutorHistoryJson(shown, executor, Caller{"t1", Role::kAdmin, "", "ops", DefaultScopes(Role::kAdmin)}, step);
  ASSERT_EQ(admin["t"].size(), 4u) << DumpJson(admin);  // the two points, the gap, the last
  EXPECT_EQ(admin["state"][0], "available");
  EXPECT_EQ(admin["state"][1], "busy");
  EXPECT_TRUE(admin["state"][2].is_null());  // the gap
  EXPECT_TRUE(admin["state"][3].is_null());  // not seen
  EXPECT_TRUE(admin["records_per_second"][0].is_null());  // nothing before the first point
  EXPECT_DOUBLE_EQ(admin["records_per_second"][1].get<double>(),
                   static_cast<double>(records - points[0].executors[executor].records_done) / 15);
  EXPECT_EQ(admin["tasks"][1], 1);
  Json viewer = ExecutorHistoryJson(shown, executor, Caller{"t2", Role::kViewer, "ml", "dash", DefaultScopes(Role::kViewer)}, step);
  EXPECT_FALSE(viewer.contains("tasks"));
  EXPECT_EQ(viewer["state"], admin["state"]);
  // Over HTTP: a credential is needed, and the executor named.
  EXPECT_EQ(HttpGet(base_ + "/api/history/executor?id=" + executor).status, 401);
  GetJson("/api/history/executor", 400);
  Json served = GetJson("/api/history/executor?id=" + executor);
  EXPECT_EQ(served["state"][0], "available");
}

// Tokens per second: each server adds what it admitted in the step that ended, the chart shows
// their sum per team at the step's end (0 in a step with none); a team sees its own only.
TEST_F(DashboardTest, TokensPerSecondSumEveryServersAndShowATeamItsOwn) {
  Team team;
  team.name = "ml";
  ASSERT_TRUE(store_->CreateTeam(team).ok());
  ASSERT_TRUE(fleet_->RecordHistory().ok());  // the first point
  const absl::Time first = Must(fleet_->History()).front().at;
  clock_.Advance(absl::Seconds(15));
  // This server admitted 30 prompt and 150 completion tokens of team ml, and 15 of ads...
  ASSERT_TRUE(fleet_->RecordTokens({{"ml", {30, 150}}, {"ads", {0, 15}}}).ok());
  // ...and a second server on the same store 75 completion tokens of ml.
  ProgressTracker progress;
  FleetView other(store_.get(), &clock_, &progress, absl::Seconds(1));
  ASSERT_TRUE(other.RecordTokens({{"ml", {0, 75}}}).ok());
  ASSERT_TRUE(fleet_->RecordHistory().ok());  // the second point, at the step's end
  // The same totals again: nothing more is added.
  ASSERT_TRUE(fleet_->RecordTokens({{"ml", {30, 150}}, {"ads", {0, 15}}}).ok());

  Json history = GetJson("/api/history");
  ASSERT_EQ(history["tokens"].size(), 2u) << DumpJson(history);
  const Json& ml = history["tokens"][1];
  ASSERT_EQ(ml["team"], "ml");
  const double at = absl::ToDoubleSeconds(first + absl::Seconds(15) - absl::UnixEpoch());
  size_t second = 0;
  while (second < history["t"].size() && history["t"][second].get<double>() != at) ++second;
  ASSERT_LT(second, history["t"].size()) << DumpJson(history);
  EXPECT_EQ(ml["completion_per_second"][0].get<double>(), 0);  // nothing in the step before
  EXPECT_DOUBLE_EQ(ml["completion_per_second"][second].get<double>(), 15);  // (150 + 75) / 15 s
  EXPECT_DOUBLE_EQ(ml["prompt_per_second"][second].get<double>(), 2);
  EXPECT_DOUBLE_EQ(history["tokens"][0]["completion_per_second"][second].get<double>(), 1);
  // A newest point in the middle of a step has no tokens yet (null, not 0).
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(fleet_->Get().ok());
  Json live = GetJson("/api/history");
  EXPECT_TRUE(live["tokens"][1]["completion_per_second"].back().is_null()) << DumpJson(live);
  // Team ml's viewer: its own tokens only.
  Json mine = GetJson("/api/history", 200, Issue(Role::kViewer, "ml", "dash"));
  ASSERT_EQ(mine["tokens"].size(), 1u);
  EXPECT_EQ(mine["tokens"][0]["team"], "ml");
}

// A server that stops in the middle of a step writes the tokens it admitted in it (issue 39,
// point 4): they show at the step's end with the other servers' of that step, none lost.
TEST_F(DashboardTest, TokensOfAServersLastPartialStepAreWrittenWhenItStops) {
  Team team;
  team.name = "ml";
  ASSERT_TRUE(store_->CreateTeam(team).ok());
  ASSERT_TRUE(fleet_->RecordHistory().ok());  // the first point, at a step's start
  const absl::Time first = Must(fleet_->History()).front().at;
  clock_.Advance(first + absl::Seconds(15) - clock_.Now());  // the next step's start
  ASSERT_TRUE(fleet_->RecordTokens({{"ml", {0, 30}}}).ok());  // the step that ended
  ASSERT_TRUE(fleet_->RecordHistory().ok());
  clock_.Advance(absl::Seconds(5));
  // 60 more completion tokens, then the server stops 5 s into the step.
  ASSERT_TRUE(fleet_->RecordTokens({{"ml", {0, 90}}}, /*stopping=*/true).ok());
  // A second server writes its own of that step when the step ends, and records the point.
  clock_.Advance(absl::Seconds(10));
  ProgressTracker progress;
  FleetView other(store_.get(), &clock_, &progress, absl::Seconds(1));
  ASSERT_TRUE(other.RecordTokens({{"ml", {0, 15}}}).ok());
  ASSERT_TRUE(other.RecordHistory().ok());

  Json history = GetJson("/api/history");
  ASSERT_EQ(history["tokens"].size(), 1u) << DumpJson(history);
  const Json& ml = history["tokens"][0];
  auto index_of = [&](absl::Time t) {
    const double at = absl::ToDoubleSeconds(t - absl::UnixEpoch());
    size_t i = 0;
    while (i < history["t"].size() && history["t"][i].get<double>() != at) ++i;
    return i;
  };
  const size_t second = index_of(first + absl::Seconds(15)), third = index_of(first + absl::Seconds(30));
  ASSERT_LT(third, history["t"].size()) << DumpJson(history);
  EXPECT_DOUBLE_EQ(ml["completion_per_second"][second].get<double>(), 2);  // 30 / 15 s
  EXPECT_DOUBLE_EQ(ml["completion_per_second"][third].get<double>(), 5);   // (60 + 15) / 15 s
}

// Points older than FleetView::kHistorySpan are removed as new ones are recorded: the stored
// history stays bounded however long the server runs.
TEST_F(DashboardTest, TheStoredHistoryStaysBounded) {
  FleetView fleet(store_.get(), &clock_, &progress_, absl::Seconds(1), absl::Seconds(30), absl::Minutes(30));
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(fleet.RecordHistory().ok());
    clock_.Advance(absl::Minutes(30));
  }
  // Six hours at a point per half hour: 12 or 13 points, never the 20 recorded.
  EXPECT_LE(Must(store_->ListFleetHistory(absl::InfinitePast())).size(), 13u);
}

// The fleet table's data: each machine's device (kind and name), usable memory and cached models
// as NAME@short digest, named by the viewer's own team's registry only (another team's viewer
// sees the short digest, not the name).
TEST_F(DashboardTest, TheFleetShowsEachMachinesDeviceMemoryAndCachedModelsByName) {
  const std::string digest = "sha256:" + std::string(64, 'a');
  ModelRecord model;
  model.team = "ml";
  model.name = "llama-3b";
  model.digest = digest;
  model.size_bytes = 1000;
  model.blob_key = "models/ml/sha256/" + std::string(64, 'a');
  model.created_at = clock_.Now();
  ASSERT_TRUE(store_->AddModel(model).ok());
  ExecutorInfo info;
  info.name = "mac";
  info.chip = "Apple M2 Max";
  info.accelerator = kAcceleratorMetal;
  info.gpu = "Apple M2 Max";
  info.memory_bytes = int64_t{32} << 30;
  info.usable_memory_bytes = int64_t{24} << 30;
  info.models = {digest, "sha256:" + std::string(64, 'b')};
  info.model_loaded = digest;
  info.max_tasks = 1;
  Must(store_->RegisterExecutor("", info, clock_.Now()));

  Team ml;
  ml.name = "ml";
  ml.created_at = clock_.Now();
  ASSERT_TRUE(store_->CreateTeam(ml).ok());
  Team ads;
  ads.name = "ads";
  ads.created_at = clock_.Now();
  ASSERT_TRUE(store_->CreateTeam(ads).ok());
  const std::string ml_viewer = Issue(Role::kViewer, "ml", "ann");
  const std::string ads_viewer = Issue(Role::kViewer, "ads", "bo");

  Json mine = GetJson("/api/fleet", 200, ml_viewer)["executors"][0];
  EXPECT_EQ(mine["accelerator"], "metal");
  EXPECT_EQ(mine["device"], "Apple M2 Max");
  EXPECT_EQ(mine["usable_memory_bytes"], int64_t{24} << 30);
  // A team sees the digests its own registry names; bytes no model of its names are not its
  // business (docs/security.md, 40.7f).
  EXPECT_EQ(mine["models_shown"], Json({"llama-3b@sha256:aaaaaaaaaaaa"}));
  EXPECT_EQ(mine["model_loaded_shown"], "llama-3b@sha256:aaaaaaaaaaaa");
  Json theirs = GetJson("/api/fleet", 200, ads_viewer)["executors"][0];
  EXPECT_EQ(theirs["models_shown"], Json::array());
  EXPECT_EQ(theirs["model_loaded_shown"], "(another team's model)");
  Json admins = GetJson("/api/fleet")["executors"][0];
  EXPECT_EQ(admins["models_shown"], Json({"llama-3b@sha256:aaaaaaaaaaaa", "sha256:bbbbbbbbbbbb"}));
}

TEST_F(DashboardTest, HealthAndReadiness) {
  HttpReply health = HttpGet(base_ + "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(HttpGet(base_ + "/readyz").status, 200);
  serving_ = false;  // shutting down
  HttpReply ready = HttpGet(base_ + "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_THAT(ready.body, HasSubstr("shutting down"));
  EXPECT_EQ(HttpGet(base_ + "/healthz").status, 200);  // alive all the same
}

TEST_F(DashboardTest, TheDashboardIsServedFromTheBinary) {
  HttpReply page = HttpGet(base_ + "/", 10000, Bearer(admin_));
  EXPECT_EQ(page.status, 200);
  EXPECT_THAT(page.content_type, StartsWith("text/html"));
  EXPECT_THAT(page.body, HasSubstr("<script src=\"/app.js\">"));
  HttpReply script = HttpGet(base_ + "/app.js");
  EXPECT_EQ(script.status, 200);
  EXPECT_THAT(script.content_type, StartsWith("text/javascript"));
  EXPECT_THAT(script.body, HasSubstr("/api/fleet"));
  EXPECT_EQ(HttpGet(base_ + "/style.css").status, 200);
  // The charting library travels with the page (no CDN).
  EXPECT_THAT(page.body, HasSubstr("<script src=\"/uplot.js\">"));
  HttpReply uplot = HttpGet(base_ + "/uplot.js");
  EXPECT_EQ(uplot.status, 200);
  EXPECT_THAT(uplot.body, HasSubstr("uPlot"));
  EXPECT_EQ(HttpGet(base_ + "/uplot.css").status, 200);
  HttpReply missing = HttpGet(base_ + "/nothing-here");
  EXPECT_EQ(missing.status, 404);
}

TEST(HttpServerTest, AnAddressWithoutAPortOrATakenPortIsAClearError) {
  HttpServer a;
  absl::Status bad = a.Start("localhost");
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.message()), HasSubstr("host:port"));
  HttpServer b;
  ASSERT_TRUE(b.Start("127.0.0.1:0").ok());
  HttpServer c;
  absl::Status taken = c.Start(absl::StrCat("127.0.0.1:", b.port()));
  EXPECT_FALSE(taken.ok());
  EXPECT_THAT(std::string(taken.message()), HasSubstr("cannot listen"));
}

}  // namespace
}  // namespace minions::testing

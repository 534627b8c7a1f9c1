// The executor agent's parts alone, and the agent through a fake of its domain-typed control
// plane (AgentControlPlane): what it asks, says and reports, seen as the domain's values, without
// a server or a protobuf. The stories with a real server in the process are agent_scenario_test.cc.

#include <filesystem>
#include <fstream>
#include <map>

#include "executor/agent.h"
#include "executor/agent_control_plane.h"
#include "executor/heartbeater.h"
#include "executor/lease_window.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_clock.h"
#include "testing/fake_runner.h"

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::minions::testing::FakeClock;

// --- LeaseWindow ---

LeaseWindow::Options WindowOptions() {
  return {/*max_prefetch=*/32, /*prefetch_target=*/absl::Milliseconds(500), /*lease_wait=*/absl::Seconds(30),
          /*idle_poll=*/absl::Milliseconds(200)};
}

TEST(LeaseWindowTest, HoldingNothingItLongPollsForAtLeastTwoTasks) {
  LeaseWindow window(WindowOptions());
  const absl::Time now = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(window.Due(0, now));
  AgentLeaseAsk ask = window.Ask(0);
  EXPECT_EQ(ask.wait, absl::Seconds(30));
  EXPECT_EQ(ask.max_tasks, 2);  // a 1 s average task: the running one and the next
  EXPECT_FALSE(ask.reclaim);
  // Holding one task, it asks for more without a long poll.
  EXPECT_EQ(window.Ask(1).wait, absl::ZeroDuration());
}

TEST(LeaseWindowTest, ShortTasksWidenTheWindowUpToItsCap) {
  LeaseWindow window(WindowOptions());
  for (int i = 0; i < 50; ++i) window.TaskTook(absl::Milliseconds(10));
  EXPECT_EQ(window.Size(), 32);
  for (int i = 0; i < 50; ++i) window.TaskTook(absl::Seconds(10));
  EXPECT_EQ(window.Size(), 2);
}

TEST(LeaseWindowTest, ItTopsUpOnlyWhenHalfTheWindowIsFree) {
  LeaseWindow window(WindowOptions());
  for (int i = 0; i < 50; ++i) window.TaskTook(absl::Milliseconds(10));
  const absl::Time now = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(window.Due(17, now));
  EXPECT_EQ(window.NextAsk(17), absl::InfiniteFuture());
  EXPECT_TRUE(window.Due(16, now));
}

TEST(LeaseWindowTest, AnUnansweredCallIsReclaimedAfterABackOff) {
  LeaseWindow window(WindowOptions());
  const absl::Time asked = absl::FromUnixSeconds(1000);
  window.Failed(absl::UnavailableError("gone"), asked, asked + absl::Milliseconds(5));
  EXPECT_TRUE(window.unheard());
  EXPECT_FALSE(window.Due(0, asked + absl::Milliseconds(100)));  // no hammering a server that is down
  EXPECT_TRUE(window.Due(0, asked + absl::Milliseconds(205)));
  EXPECT_TRUE(window.Ask(0).reclaim);
  // Even with a full window: what was granted unheard is asked for at once.
  EXPECT_TRUE(window.Due(30, asked + absl::Milliseconds(300)));
  window.Answered(window.Ask(0), 1, asked + absl::Seconds(1), asked + absl::Seconds(1));
  EXPECT_FALSE(window.unheard());
}

TEST(LeaseWindowTest, ARefusedCallReclaimsNothing) {
  for (absl::Status refusal : {absl::PermissionDeniedError("no"), absl::UnauthenticatedError("no"),
                               absl::NotFoundError("who"), absl::InvalidArgumentError("bad")}) {
    LeaseWindow window(WindowOptions());
    window.Failed(refusal, absl::FromUnixSeconds(1000), absl::FromUnixSeconds(1000));
    EXPECT_FALSE(window.unheard()) << refusal;
  }
}

// A pool that leases this executor nothing as it is (one that requires confined runners): no
// reclaim, and no asking again before a long poll's wait, not five times a second.
TEST(LeaseWindowTest, ACallRefusedForWhatTheExecutorIsWaitsALongPoll) {
  LeaseWindow window(WindowOptions());
  const absl::Time asked = absl::FromUnixSeconds(1000);
  window.Failed(absl::FailedPreconditionError("confined runners only"), asked, asked);
  EXPECT_FALSE(window.unheard());
  EXPECT_FALSE(window.Due(0, asked + absl::Seconds(29)));
  EXPECT_TRUE(window.Due(0, asked + absl::Seconds(30)));
}

TEST(LeaseWindowTest, ALongPollAnsweredEarlyWithNothingBacksOff) {
  LeaseWindow window(WindowOptions());
  const absl::Time asked = absl::FromUnixSeconds(1000);
  window.Answered(window.Ask(0), 0, asked, asked + absl::Seconds(1));
  EXPECT_FALSE(window.Due(0, asked + absl::Seconds(1)));
  EXPECT_TRUE(window.Due(0, asked + absl::Seconds(1) + absl::Milliseconds(200)));
  // Answered after its whole wait: ask again at once.
  LeaseWindow patient(WindowOptions());
  patient.Answered(patient.Ask(0), 0, asked, asked + absl::Seconds(30));
  EXPECT_TRUE(patient.Due(0, asked + absl::Seconds(30)));
}

// --- Heartbeater ---

// What the agent would hold, set by the test.
class FixedSource : public BeatSource {
 public:
  Holdings Collect(absl::Time) override { return held; }
  std::string FleetState(bool holds_work, std::string*) const override { return holds_work ? "busy" : "available"; }
  void OnBeatAnswer(const AgentBeatAnswer& answer) override { answers.push_back(answer); }
  Holdings held{"exe-1", {}, {}, "", std::nullopt};
  std::vector<AgentBeatAnswer> answers;
};

// Counts beats and fails them on demand.
class BeatCountingPlane : public AgentControlPlane {
 public:
  absl::StatusOr<AgentRegistration> Register(const std::string&, const v1::Capabilities&) override {
    return absl::UnimplementedError("not here");
  }
  absl::StatusOr<AgentBeatAnswer> Heartbeat(const AgentBeat& beat) override {
    beats.push_back(beat);
    if (down) return absl::UnavailableError("away");
    return AgentBeatAnswer{};
  }
  absl::StatusOr<AgentLeaseAnswer> Lease(const AgentLeaseAsk&) override { return absl::UnimplementedError(""); }
  absl::StatusOr<std::vector<absl::Status>> CompleteBatch(const std::string&,
                                                          const std::vector<LeaseProgress>&) override {
    return absl::UnimplementedError("");
  }
  absl::Status Fail(const std::string&, const LeaseProgress&, FailureClass, const std::string&) override {
    return absl::UnimplementedError("");
  }
  void InterruptLease() override {}
  std::vector<AgentBeat> beats;
  bool down = false;
};

class HeartbeaterTest : public ::testing::Test {
 protected:
  HeartbeaterTest() : heartbeater_(Heartbeater::Options{absl::Minutes(2), nullptr, nullptr}, &plane_, &source_, &clock_) {
    heartbeater_.Registered(AgentRegistration{"exe-1", absl::Seconds(9), absl::Seconds(13), /*idle_polls_renew=*/true});
  }
  FakeClock clock_;
  BeatCountingPlane plane_;
  FixedSource source_;
  Heartbeater heartbeater_;
};

TEST_F(HeartbeaterTest, RegisteredItBeatsAtOnceThenAtTheIdlePace) {
  EXPECT_EQ(heartbeater_.Due(), absl::InfinitePast());
  heartbeater_.Beat();
  ASSERT_EQ(plane_.beats.size(), 1u);
  EXPECT_EQ(plane_.beats[0].state, "available");
  EXPECT_EQ(heartbeater_.Due(), clock_.Now() + absl::Seconds(13));
  // A lease comes: the next beat within a third of the TTL.
  heartbeater_.Soon(clock_.Now());
  EXPECT_EQ(heartbeater_.Due(), clock_.Now() + absl::Seconds(3));
}

TEST_F(HeartbeaterTest, WhileAnIdlePollStandsAnIdleBeatThatSaysNothingNewStaysUnsent) {
  heartbeater_.Beat();  // the forced first beat
  heartbeater_.IdlePollStarted();
  clock_.Advance(absl::Seconds(13));
  heartbeater_.Beat();
  EXPECT_EQ(plane_.beats.size(), 1u);
  EXPECT_LE(heartbeater_.Due(), clock_.Now() + absl::Seconds(3));  // looked at again within a third
  // Something new (a model loaded) is said even while the poll stands.
  source_.held.model_loaded = "m";
  heartbeater_.Beat();
  EXPECT_EQ(plane_.beats.size(), 2u);
}

TEST_F(HeartbeaterTest, AServerThatDoesNotRenewFromPollsIsBeatenToAtOnce) {
  heartbeater_.Beat();
  heartbeater_.IdlePollStarted();
  heartbeater_.IdlePollEnded(/*answered=*/true, /*renewed=*/false);
  EXPECT_FALSE(heartbeater_.idle_polls_renew());
  EXPECT_EQ(heartbeater_.Due(), absl::InfinitePast());
}

TEST_F(HeartbeaterTest, AStuckMainLoopRenewsNoLease) {
  source_.held.leases = {std::make_shared<const LeaseProgress>(LeaseProgress{"job-1", 0, 1, 5, 0, {}})};
  heartbeater_.Beat();
  ASSERT_EQ(plane_.beats.back().leases.size(), 1u);
  source_.held.stuck_since = clock_.Now();
  clock_.Advance(absl::Minutes(3));
  heartbeater_.Beat();
  EXPECT_TRUE(plane_.beats.back().leases.empty());
  EXPECT_EQ(plane_.beats.back().state, "busy");
}

TEST_F(HeartbeaterTest, AnswersGoToTheAgentAndAFailedBeatIsNotAnAnswer) {
  heartbeater_.Beat();
  EXPECT_EQ(source_.answers.size(), 1u);
  plane_.down = true;
  heartbeater_.BeatNow();
  heartbeater_.Beat();
  EXPECT_EQ(plane_.beats.size(), 2u);
  EXPECT_EQ(source_.answers.size(), 1u);
}

// --- The agent through a fake control plane ---

// The control plane as a script: it records every call in domain values and answers what the
// test queued. Threads: the test's only (the agent is driven by Step and Beat).
class ScriptedControlPlane : public AgentControlPlane {
 public:
  absl::StatusOr<AgentRegistration> Register(const std::string& executor_id, const v1::Capabilities&) override {
    registrations.push_back(executor_id);
    return AgentRegistration{"exe-1", absl::Seconds(9), absl::Seconds(13), /*idle_polls_renew=*/false};
  }
  absl::StatusOr<AgentBeatAnswer> Heartbeat(const AgentBeat& beat) override {
    beats.push_back(beat);
    AgentBeatAnswer answer;
    answer.cancel.swap(cancel_next);
    return answer;
  }
  absl::StatusOr<AgentLeaseAnswer> Lease(const AgentLeaseAsk& ask) override {
    asks.push_back(ask);
    if (lease_failures > 0) {
      --lease_failures;
      return absl::UnavailableError("the answer was lost");
    }
    AgentLeaseAnswer answer;
    answer.leases.swap(grants);
    return answer;
  }
  absl::StatusOr<std::vector<absl::Status>> CompleteBatch(const std::string& executor_id,
                                                          const std::vector<LeaseProgress>& done) override {
    for (const LeaseProgress& progress : done) completed.push_back(progress);
    return std::vector<absl::Status>(done.size(), absl::OkStatus());
  }
  absl::Status Fail(const std::string&, const LeaseProgress& progress, FailureClass failure,
                    const std::string& message) override {
    failed.push_back({progress, failure, message});
    return absl::OkStatus();
  }
  void InterruptLease() override {}
  absl::StatusOr<std::vector<VerificationGrant>> LeaseVerifications(const std::string& executor_id,
                                                                   int max_tasks) override {
    verification_asks.push_back(max_tasks);
    if (!offers_verifications) return absl::UnimplementedError("an older server");
    std::vector<VerificationGrant> out;
    out.swap(verifications);
    return out;
  }
  absl::Status ReportVerifications(const std::string& executor_id, const VerificationGrant& grant,
                                   const std::vector<RecordVerdict>& verdicts) override {
    reports.push_back({grant, verdicts});
    return absl::OkStatus();
  }

  struct Failure {
    LeaseProgress progress;
    FailureClass failure;
    std::string message;
  };
  std::vector<LeaseGrant> grants;  // the next answered Lease grants these
  int lease_failures = 0;          // the next n Lease calls fail
  std::vector<AttemptRef> cancel_next;
  std::vector<std::string> registrations;
  std::vector<AgentBeat> beats;
  std::vector<AgentLeaseAsk> asks;
  std::vector<LeaseProgress> completed;
  std::vector<Failure> failed;
  // Spot checks.
  bool offers_verifications = true;
  std::vector<VerificationGrant> verifications;  // the next LeaseVerifications grants these
  std::vector<int> verification_asks;
  struct Report {
    VerificationGrant grant;
    std::vector<RecordVerdict> verdicts;
  };
  std::vector<Report> reports;
};

// Objects by URL in memory.
class MemoryBlobs : public BlobClient {
 public:
  explicit MemoryBlobs(std::map<std::string, std::string>* objects) : objects_(objects) {}
  absl::StatusOr<std::string> GetRange(const std::string& url, int64_t begin, int64_t end) override {
    auto it = objects_->find(url);
    if (it == objects_->end()) return absl::NotFoundError(url);
    return it->second.substr(begin, end - begin);
  }
  absl::Status Put(const std::string& url, std::string_view data) override {
    (*objects_)[url] = std::string(data);
    return absl::OkStatus();
  }

 private:
  std::map<std::string, std::string>* objects_;
};

class AgentThroughAFakeTest : public ::testing::Test {
 protected:
  AgentThroughAFakeTest() {
    dir_ = std::filesystem::temp_directory_path() / ("agent_parts_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    model_ = (dir_ / "model.gguf").string();
    std::ofstream(model_) << "";
    ModelAccessOptions models;
    models.folders = {dir_.string()};
    AgentOptions options;
    options.name = "fake";
    options.models = std::make_shared<const ModelAccess>(*ModelAccess::Create(models));
    auto plane = std::make_unique<ScriptedControlPlane>();
    plane_ = plane.get();
    agent_ = std::make_unique<ExecutorAgent>(std::move(options), std::move(plane),
                                             std::make_unique<MemoryBlobs>(&objects_),
                                             std::make_unique<::minions::testing::FakeRunnerFactory>(&clock_, &script_),
                                             &clock_);
  }
  ~AgentThroughAFakeTest() override {
    agent_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A lease of `n` records, its input in the object store.
  LeaseGrant Grant(int attempt, int n) {
    LeaseGrant grant;
    grant.ref = {"job-1", 0, attempt};
    grant.n_records = n;
    std::string input;
    for (int i = 0; i < n; ++i) input += "{\"custom_id\":\"r" + std::to_string(i) + "\",\"body\":{}}\n";
    grant.input_url = "mem://input";
    objects_[grant.input_url] = input;
    grant.byte_end = static_cast<int64_t>(input.size());
    grant.model = model_;
    grant.chunk_urls = {{"mem://out-0", "mem://err-0"}};
    return grant;
  }

  // A spot check of `claims.size()` records of another executor's chunk: record i claimed
  // claims[i] (an output line, or anything).
  VerificationGrant Verification(const std::vector<std::string>& claims, const std::string& model = "") {
    VerificationGrant grant;
    grant.job.ref = {"job-9", 2, 1};
    grant.seq = 0;
    grant.job.model = model.empty() ? model_ : model;
    grant.job.expires_at = clock_.Now() + absl::Seconds(60);
    for (size_t i = 0; i < claims.size(); ++i) {
      const std::string id = "v" + std::to_string(i);
      grant.items.push_back({static_cast<int64_t>(i * 3), id, "{\"custom_id\":\"" + id + "\",\"body\":{}}", claims[i]});
    }
    return grant;
  }
  static std::string Claim(const std::string& custom_id, const std::string& text) {
    return DumpJson(MakeResponseLine(custom_id, MakeCompletionBody(custom_id, "fake", text, "stop", {}, 0)));
  }

  // Plays the agent's two loops on fake time for `span`, 10 ms at a time.
  void Play(absl::Duration span) {
    for (absl::Time end = clock_.Now() + span; clock_.Now() < end; clock_.Advance(absl::Milliseconds(10))) {
      agent_->Step();
      if (agent_->NextBeat() <= clock_.Now()) agent_->Beat();
    }
  }

  FakeClock clock_;
  ::minions::testing::FakeRunnerScript script_;
  std::map<std::string, std::string> objects_;
  std::filesystem::path dir_;
  std::string model_;
  ScriptedControlPlane* plane_;
  std::unique_ptr<ExecutorAgent> agent_;
};

TEST_F(AgentThroughAFakeTest, ItRegistersThenSaysItIsAvailableAndLongPolls) {
  Play(absl::Milliseconds(100));
  EXPECT_THAT(plane_->registrations, ElementsAre(""));
  EXPECT_EQ(agent_->id(), "exe-1");
  ASSERT_FALSE(plane_->beats.empty());
  EXPECT_EQ(plane_->beats.front().executor_id, "exe-1");
  EXPECT_EQ(plane_->beats.front().state, "available");
  EXPECT_TRUE(plane_->beats.front().leases.empty());
  ASSERT_FALSE(plane_->asks.empty());
  EXPECT_EQ(plane_->asks.front().wait, absl::Seconds(30));
  EXPECT_FALSE(plane_->asks.front().idle);  // this server does not renew from polls
}

TEST_F(AgentThroughAFakeTest, AGrantedTaskRunsAndIsCompletedWithItsChunk) {
  plane_->grants = {Grant(1, 3)};
  Play(absl::Seconds(2));
  ASSERT_EQ(plane_->completed.size(), 1u);
  const LeaseProgress& done = plane_->completed.front();
  EXPECT_EQ(done.job_id, "job-1");
  EXPECT_EQ(done.attempt, 1);
  EXPECT_EQ(done.records_done, 3);
  ASSERT_EQ(done.chunks.size(), 1u);
  EXPECT_EQ(done.chunks[0].end, 3);
  EXPECT_TRUE(objects_.contains("mem://out-0"));
  EXPECT_EQ(agent_->tasks_completed(), 1);
  EXPECT_TRUE(plane_->failed.empty());
}

TEST_F(AgentThroughAFakeTest, ALostLeaseAnswerIsReclaimedWithWhatItHolds) {
  plane_->lease_failures = 1;
  Play(absl::Seconds(1));
  ASSERT_GE(plane_->asks.size(), 2u);
  EXPECT_FALSE(plane_->asks[0].reclaim);
  EXPECT_TRUE(plane_->asks[1].reclaim);
  EXPECT_TRUE(plane_->asks[1].held.empty());
  for (size_t i = 2; i < plane_->asks.size(); ++i) EXPECT_FALSE(plane_->asks[i].reclaim) << i;
}

TEST_F(AgentThroughAFakeTest, ATaskTheServerCancelsIsNeitherCompletedNorFailed) {
  script_.record_time = absl::Seconds(1);
  plane_->grants = {Grant(1, 5)};
  Play(absl::Milliseconds(500));
  ASSERT_FALSE(plane_->beats.empty());
  plane_->cancel_next = {AttemptRef{"job-1", 0, 1}};
  agent_->Beat();
  Play(absl::Seconds(10));
  EXPECT_TRUE(plane_->completed.empty());
  EXPECT_TRUE(plane_->failed.empty());
  EXPECT_TRUE(plane_->beats.back().leases.empty());
}

}  // namespace
}  // namespace minions

namespace minions {
namespace {

TEST_F(AgentThroughAFakeTest, AnIdleAgentReScoresASpotCheckAndReportsOneVerdictPerRecord) {
  plane_->verifications = {Verification({Claim("v0", "honest"), Claim("v1", "a forged answer"), "not json"})};
  Play(absl::Seconds(2));
  ASSERT_EQ(plane_->reports.size(), 1u);
  const auto& report = plane_->reports.front();
  EXPECT_EQ(report.grant.job.ref, (AttemptRef{"job-9", 2, 1}));
  ASSERT_EQ(report.verdicts.size(), 3u);
  EXPECT_EQ(report.verdicts[0].record, 0);
  EXPECT_TRUE(report.verdicts[0].checked);
  EXPECT_TRUE(report.verdicts[0].passed);
  EXPECT_EQ(report.verdicts[1].record, 3);
  EXPECT_TRUE(report.verdicts[1].checked);
  EXPECT_FALSE(report.verdicts[1].passed);
  EXPECT_THAT(report.verdicts[1].reason, HasSubstr("nats"));
  // A claimed line that is not JSON is not sent to the runner: unchecked, nothing against anyone.
  EXPECT_EQ(report.verdicts[2].record, 6);
  EXPECT_FALSE(report.verdicts[2].checked);
  EXPECT_THAT(report.verdicts[2].reason, HasSubstr("JSON"));
  EXPECT_EQ(script_.loads, 1);
  EXPECT_EQ(script_.items_rescored, 2);
  EXPECT_EQ(agent_->verifications_reported(), 1);
  EXPECT_EQ(agent_->tasks_completed(), 0);
}

TEST_F(AgentThroughAFakeTest, WhatTheRunnerCannotCheckIsReportedAsNotChecked) {
  script_.cannot_rescore = true;
  plane_->verifications = {Verification({Claim("v0", "honest"), Claim("v1", "honest")})};
  Play(absl::Seconds(2));
  ASSERT_EQ(plane_->reports.size(), 1u);
  ASSERT_EQ(plane_->reports[0].verdicts.size(), 2u);
  for (const RecordVerdict& verdict : plane_->reports[0].verdicts) {
    EXPECT_FALSE(verdict.checked);
    EXPECT_THAT(verdict.reason, HasSubstr("cannot check"));
  }
}

TEST_F(AgentThroughAFakeTest, ASpotCheckWhoseModelDoesNotLoadIsReportedAsNotChecked) {
  script_.bad_model = model_;
  plane_->verifications = {Verification({Claim("v0", "honest")})};
  Play(absl::Seconds(2));
  ASSERT_EQ(plane_->reports.size(), 1u);
  ASSERT_EQ(plane_->reports[0].verdicts.size(), 1u);
  EXPECT_FALSE(plane_->reports[0].verdicts[0].checked);
  EXPECT_THAT(plane_->reports[0].verdicts[0].reason, HasSubstr("did not load"));
  EXPECT_TRUE(plane_->failed.empty());  // no task was involved
}

TEST_F(AgentThroughAFakeTest, AModelOutsideTheOwnersFoldersIsNeverLoadedForASpotCheck) {
  plane_->verifications = {Verification({Claim("v0", "honest")}, "/etc/passwd")};
  Play(absl::Seconds(2));
  ASSERT_EQ(plane_->reports.size(), 1u);
  EXPECT_FALSE(plane_->reports[0].verdicts[0].checked);
  EXPECT_THAT(plane_->reports[0].verdicts[0].reason, HasSubstr("cannot load the model"));
  EXPECT_EQ(script_.loads, 0);
}

TEST_F(AgentThroughAFakeTest, TheRunnerDyingMidCheckLeavesItsRecordsUncheckedAndTheAgentServing) {
  script_.record_time = absl::Seconds(1);
  plane_->verifications = {Verification({Claim("v0", "honest"), Claim("v1", "honest"), Claim("v2", "honest")})};
  Play(absl::Milliseconds(1500));
  ASSERT_EQ(script_.rescores.size(), 1u);
  agent_->KillRunner("test");
  Play(absl::Seconds(1));
  ASSERT_EQ(plane_->reports.size(), 1u);
  const auto& verdicts = plane_->reports[0].verdicts;
  ASSERT_EQ(verdicts.size(), 3u);
  EXPECT_TRUE(verdicts[0].checked);
  EXPECT_FALSE(verdicts[2].checked);
  EXPECT_THAT(verdicts[2].reason, HasSubstr("runner ended"));
  // Still serving: a task granted afterwards runs.
  plane_->grants = {Grant(1, 2)};
  Play(absl::Seconds(3));
  EXPECT_EQ(agent_->tasks_completed(), 1);
}

TEST_F(AgentThroughAFakeTest, ASpotCheckWaitsForTheTaskInHandAndNeverPreemptsIt) {
  script_.record_time = absl::Seconds(1);
  plane_->grants = {Grant(1, 3)};
  Play(absl::Milliseconds(100));
  ASSERT_TRUE(agent_->HoldsWork());
  const size_t asked = plane_->verification_asks.size();
  plane_->verifications = {Verification({Claim("v0", "honest")})};
  Play(absl::Seconds(2));
  // The task runs: no spot check is asked for yet (its last ask, on starting, was less than
  // verify_poll ago), none sent to the runner.
  EXPECT_EQ(plane_->verification_asks.size(), asked);
  EXPECT_TRUE(script_.rescores.empty());
  Play(absl::Seconds(10));
  ASSERT_EQ(plane_->completed.size(), 1u);
  EXPECT_EQ(plane_->completed[0].records_done, 3);
  ASSERT_EQ(plane_->reports.size(), 1u);
  EXPECT_TRUE(plane_->reports[0].verdicts[0].passed);
  EXPECT_EQ(script_.loads, 1);  // the same model: loaded once for both
}

// A busy agent whose lease call came back empty (nothing more for it on the server now) asks for
// a spot check and has it re-scored between its tasks: the task in hand is not preempted (the
// check is queued behind it on the runner), the model is not loaded again, and it goes on leasing
// meanwhile.
TEST_F(AgentThroughAFakeTest, ABusyAgentWithNothingMoreToLeaseTakesASpotCheckBetweenItsTasks) {
  script_.record_time = absl::Seconds(1);
  plane_->grants = {Grant(1, 10)};
  Play(absl::Milliseconds(100));
  ASSERT_TRUE(agent_->HoldsWork());
  plane_->verifications = {Verification({Claim("v0", "honest")})};
  Play(absl::Seconds(6));  // past the verify_poll since its ask on starting
  ASSERT_EQ(script_.rescores.size(), 1u) << "asked for and sent while busy";
  EXPECT_TRUE(plane_->completed.empty());
  EXPECT_TRUE(plane_->reports.empty()) << "queued behind the task on the runner";
  const size_t asks = plane_->asks.size();
  Play(absl::Seconds(1));
  EXPECT_GT(plane_->asks.size(), asks) << "leasing goes on while the check waits on the runner";
  Play(absl::Seconds(10));
  ASSERT_EQ(plane_->completed.size(), 1u);
  EXPECT_EQ(plane_->completed[0].records_done, 10);
  ASSERT_EQ(plane_->reports.size(), 1u);
  EXPECT_TRUE(plane_->reports[0].verdicts[0].passed);
  EXPECT_EQ(script_.loads, 1);
  EXPECT_TRUE(plane_->failed.empty());
}

// Out of tasks, it first looks for more (one lease call without a long poll), and only when that
// finds nothing asks for a spot check, at once; then, idle, it long-polls again.
TEST_F(AgentThroughAFakeTest, OutOfTasksItLooksForMoreQuicklyBeforeAskingForASpotCheck) {
  script_.record_time = absl::Seconds(1);
  plane_->grants = {Grant(1, 2)};
  Play(absl::Milliseconds(100));
  ASSERT_TRUE(agent_->HoldsWork());
  const size_t checks_asked = plane_->verification_asks.size();  // the one on starting
  plane_->verifications = {Verification({Claim("v0", "honest")})};
  for (int i = 0; i < 1000 && plane_->completed.empty(); ++i) Play(absl::Milliseconds(10));
  ASSERT_EQ(plane_->completed.size(), 1u);
  EXPECT_EQ(plane_->verification_asks.size(), checks_asked) << "busy: not before its verify_poll";
  const size_t leased = plane_->asks.size();
  for (int i = 0; i < 1000 && plane_->verification_asks.size() == checks_asked; ++i) Play(absl::Milliseconds(10));
  ASSERT_EQ(plane_->verification_asks.size(), checks_asked + 1);
  ASSERT_EQ(plane_->asks.size(), leased + 1) << "one lease call between its last task and the ask";
  EXPECT_EQ(plane_->asks[leased].wait, absl::ZeroDuration()) << "a quick look, not a long poll";
  Play(absl::Seconds(3));
  ASSERT_EQ(plane_->reports.size(), 1u);
  ASSERT_GT(plane_->asks.size(), leased + 1);
  EXPECT_EQ(plane_->asks.back().wait, absl::Seconds(30)) << "idle again: a long poll";
}

TEST_F(AgentThroughAFakeTest, AServerWithoutSpotChecksIsAskedOnce) {
  plane_->offers_verifications = false;
  Play(absl::Seconds(20));
  EXPECT_EQ(plane_->verification_asks.size(), 1u);
}

}  // namespace
}  // namespace minions

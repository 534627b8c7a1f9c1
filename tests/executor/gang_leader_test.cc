// A gang's leader when its runner dies (docs/architecture.md, "Gangs"), as stories on fake time:
// the real agents and control-plane services (Scenario), fake runners, and the gang network faked
// behind its seam (FakeGangNetwork: a member "serves" at its gang address; the test cuts gates).
// The leader tells the two deaths apart by asking its members' gates: all answer, the runner
// crashed on its own (a poison record: isolated like any runner's crash, counted towards the
// isolation, no task failure); one does not, a member went away (preempted, not counted).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scenario.h"

namespace minions::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kAddressA[] = "10.0.0.1:7001";
constexpr char kAddressB[] = "10.0.0.2:7001";
constexpr char kAddressC[] = "10.0.0.3:7001";

// The executors with a gang address in `names` (A, B, C), registered with the server (a gang
// job's submission checks that the fleet can hold its gang).
void AddGangFleet(Scenario& s, const std::vector<std::string>& names) {
  const std::map<std::string, std::string> address = {{"A", kAddressA}, {"B", kAddressB}, {"C", kAddressC}};
  for (const std::string& name : names) s.AddExecutor(name, Scenario::GangOptions(address.at(name)));
  s.RunFor(absl::Seconds(1));
}

// Gives a fleet of two gang executors, A and B, whose runners crash on "poison-me", a job for gangs
// of two (3 attempts a task) of `n` records in tasks of 20, record `poisoned` the poison: its id.
std::string PoisonedGangJob(Scenario& s, int n, int poisoned) {
  AddGangFleet(s, {"A", "B"});
  s.executor("A").runner.crash_on = "poison-me";
  s.executor("B").runner.crash_on = "poison-me";
  return s.Submit(Scenario::Records(n, {{poisoned, "poison-me"}}), 20, /*max_attempts=*/3, absl::ZeroDuration(), "",
                  "", /*gang_size=*/2);
}

// The executor that leads the gang running now (its runner was started to reach a member), or
// nullptr.
Scenario::Executor* Leader(Scenario& s, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    Scenario::Executor& e = s.executor(name);
    if (e.runners->live() != nullptr && !e.runner.tcp_ports.empty()) return &e;
  }
  return nullptr;
}

TEST(GangLeaderStory, ARunnerThatCrashesOnARecordWhileItsMembersAnswerIsolatesItLikeAnyRunner) {
  Scenario s;
  std::string job = PoisonedGangJob(s, 40, 27);
  ASSERT_TRUE(s.RunUntilJobEnds(job, absl::Hours(2)));
  s.ExpectPoisonIsolated(job, 40, "r27");
  for (const Task& t : s.tasks(job)) EXPECT_EQ(t.preemptions, 0) << "task " << t.index << ": no member went away";
  // It ran on gangs (a leader's runner started to reach its member's gate), crashed and was halved.
  const int crashes = s.executor("A").runner.crashes + s.executor("B").runner.crashes;
  EXPECT_GE(crashes, 2) << "run whole, then alone and halved";
  EXPECT_LE(crashes, 7);
  EXPECT_EQ(s.gangs->served(), 2) << "one gang per task";
  // Its runner reaches one port: its loopback tunnel to the member's gate 7001 (which proves the
  // attempt's secret, executor/gang_tunnel.h), never the gate itself.
  const std::vector<int>& ports =
      s.executor("A").runner.tcp_ports.empty() ? s.executor("B").runner.tcp_ports : s.executor("A").runner.tcp_ports;
  ASSERT_EQ(ports.size(), 1u);
  EXPECT_NE(ports[0], 7001);
}

// A member whose owner comes back ends its duty at once (its gate closes), which ends the leader's
// runner (its rpc connection drops): the leader finds the gate gone and gives the attempt back as
// preempted; the task finishes on a new gang, no failure counted, no record lost or doubled.
TEST(GangLeaderStory, AMemberWhoseOwnerComesBackEndsTheAttemptAsPreempted) {
  Scenario s;
  const std::vector<std::string> fleet = {"A", "B", "C"};
  AddGangFleet(s, fleet);
  for (const std::string& name : fleet) s.executor(name).runner.record_time = absl::Milliseconds(100);
  std::string job = s.Submit(Scenario::Records(60), 60, /*max_attempts=*/3, absl::ZeroDuration(), "", "",
                             /*gang_size=*/2);
  Scenario::Executor* leader = nullptr;
  ASSERT_TRUE(s.RunUntil([&] {
    leader = Leader(s, fleet);
    return leader != nullptr && leader->runner.records_run >= 5;
  }));
  // Its member: the other executor serving a duty.
  std::string member;
  const std::map<std::string, std::string> address = {{"A", kAddressA}, {"B", kAddressB}, {"C", kAddressC}};
  for (const std::string& name : fleet) {
    if (name != leader->name && s.gangs->serving(address.at(name))) member = name;
  }
  ASSERT_FALSE(member.empty());
  s.executor(member).gate->Set(WorkMode::kRelease);
  ASSERT_TRUE(s.RunUntil([&] { return !s.gangs->serving(address.at(member)); }));
  ASSERT_NE(leader->runners->live(), nullptr);
  leader->runners->live()->Die("killed by signal 6 (Aborted): Remote RPC server crashed");

  ASSERT_TRUE(s.RunUntilJobEnds(job, absl::Hours(2)));
  Job done = s.job(job);
  ASSERT_EQ(done.state, JobState::kCompleted) << done.error;
  EXPECT_EQ(done.counts.failed, 0);
  s.ExpectEachRecordOnce(job, 60);
  Task task = s.tasks(job).at(0);
  EXPECT_EQ(task.failures, 0) << task.last_error;
  EXPECT_EQ(task.preemptions, 1);
  EXPECT_EQ(task.attempt, 2);
  EXPECT_EQ(s.executor(member).runner.records_run, 0) << "its owner is still back";
}

// A poison record crashes the leader's runner while its member answers (a crash of its own), but
// the member goes away before the next try can start: that attempt ends as preempted, not failed,
// and the next attempt isolates the record.
TEST(GangLeaderStory, AMemberGoneBeforeTheTryAfterACrashEndsTheAttemptAsPreempted) {
  Scenario s;
  std::string job = PoisonedGangJob(s, 20, 15);
  Scenario::Executor* leader = nullptr;
  ASSERT_TRUE(s.RunUntil([&] {
    leader = Leader(s, {"A", "B"});
    return leader != nullptr && leader->runner.records_run >= 3;
  }));
  const std::string member_address = leader->name == "A" ? kAddressB : kAddressA;
  ASSERT_TRUE(s.gangs->serving(member_address));
  // Asked once more when the runner dies (it answers: the crash is the runner's), then gone.
  s.gangs->CutAfter(member_address, 1);

  ASSERT_TRUE(s.RunUntilJobEnds(job, absl::Hours(2)));
  Job done = s.job(job);
  ASSERT_EQ(done.state, JobState::kCompleted) << done.error;
  std::vector<Json> errors = s.server.Results(job, true);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["custom_id"], "r15");
  s.ExpectEachRecordOnce(job, 20);
  Task task = s.tasks(job).at(0);
  EXPECT_EQ(task.failures, 0) << task.last_error;
  EXPECT_EQ(task.preemptions, 1);
  EXPECT_EQ(task.attempt, 2);
}

}  // namespace
}  // namespace minions::testing

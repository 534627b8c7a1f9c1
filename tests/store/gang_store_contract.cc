// The GangStore half of the store contract (see gang_store.h): which executors form the gang of a
// task attempt, one gang per executor at a time. Same fixture and instantiations as the
// MetadataStore contract, so every backend runs these stories too.

#include "gang_store_contract.h"

namespace minions {
namespace {

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GangStoreContract);

std::vector<std::string> Leaders(const std::vector<GangLease>& gangs) {
  std::vector<std::string> out;
  for (const GangLease& g : gangs) out.push_back(g.leader() + "@" + g.job_id.substr(0, 4) + "/" + std::to_string(g.task_index));
  return out;
}

TEST_P(GangStoreContract, AGangIsRecordedFoundFromEachSeatAndEnded) {
  const std::string job = Submit(Spec(), 2);
  const GangLease gang = Gang(job, 1, 1, {"lead", "m1", "m2"});
  ASSERT_OK(store_->RecordGang(gang));

  // Every seat finds the whole gang, leader first, as it was written.
  for (const std::string& executor : {"lead", "m1", "m2"}) {
    ASSERT_OK_AND_ASSIGN(GangLease found, store_->GangOf(executor));
    EXPECT_EQ(found, gang) << executor;
    EXPECT_EQ(found.leader(), "lead");
  }
  ASSERT_OK_AND_ASSIGN(std::vector<GangLease> all, store_->ListGangs());
  ASSERT_THAT(all, SizeIs(1));
  EXPECT_EQ(all[0].members[2].endpoint, "10.9.0.2:50052");
  EXPECT_EQ(all[0].members[2].bytes, int64_t{3} << 30);
  EXPECT_CODE(store_->GangOf("someone-else"), kNotFound);

  // Ending the attempt frees every seat; a second end finds nothing.
  ASSERT_OK(store_->EndGang(job, 1, 1));
  EXPECT_CODE(store_->GangOf("m1"), kNotFound);
  ASSERT_OK_AND_ASSIGN(all, store_->ListGangs());
  EXPECT_THAT(all, IsEmpty());
  EXPECT_CODE(store_->EndGang(job, 1, 1), kNotFound);

  // The freed executors may form the next attempt's gang, in another order.
  ASSERT_OK(store_->RecordGang(Gang(job, 1, 2, {"m2", "lead"})));
  ASSERT_OK_AND_ASSIGN(GangLease next, store_->GangOf("lead"));
  EXPECT_EQ(next.attempt, 2);
  EXPECT_EQ(next.leader(), "m2");
}

TEST_P(GangStoreContract, AnExecutorSitsInOneGangAtATime) {
  const std::string job = Submit(Spec(), 3);
  ASSERT_OK(store_->RecordGang(Gang(job, 0, 1, {"a", "b"})));
  // b is taken: the second gang is refused as a whole, naming b, and records none of its seats.
  absl::Status taken = store_->RecordGang(Gang(job, 1, 1, {"c", "d", "b"}));
  EXPECT_EQ(taken.code(), absl::StatusCode::kFailedPrecondition) << taken;
  EXPECT_THAT(std::string(taken.message()), HasSubstr("executor b"));
  EXPECT_CODE(store_->GangOf("c"), kNotFound);
  EXPECT_CODE(store_->GangOf("d"), kNotFound);
  // Nor may an attempt have two gangs.
  EXPECT_CODE(store_->RecordGang(Gang(job, 0, 1, {"c", "d"})), kAlreadyExists);

  // Other executors form other gangs; the list is oldest first.
  Advance(absl::Seconds(5));
  ASSERT_OK(store_->RecordGang(Gang(job, 2, 1, {"d", "c"})));
  ASSERT_OK_AND_ASSIGN(std::vector<GangLease> all, store_->ListGangs());
  EXPECT_THAT(Leaders(all), ElementsAre("a@" + job.substr(0, 4) + "/0", "d@" + job.substr(0, 4) + "/2"));
}

TEST_P(GangStoreContract, MalformedGangsAndUnknownTasksAreRefused) {
  const std::string job = Submit(Spec(), 1);
  EXPECT_CODE(store_->RecordGang(Gang(job, 0, 1, {"alone"})), kInvalidArgument);
  EXPECT_CODE(store_->RecordGang(Gang(job, 0, 1, {"a", "a"})), kInvalidArgument);
  EXPECT_CODE(store_->RecordGang(Gang(job, 0, 1, {"a", ""})), kInvalidArgument);
  EXPECT_CODE(store_->RecordGang(Gang(job, 0, 0, {"a", "b"})), kInvalidArgument);
  EXPECT_CODE(store_->RecordGang(Gang("", 0, 1, {"a", "b"})), kInvalidArgument);
  std::vector<std::string> crowd;
  for (size_t i = 0; i <= kMaxGangSize; ++i) crowd.push_back("e" + std::to_string(i));
  EXPECT_CODE(store_->RecordGang(Gang(job, 0, 1, crowd)), kInvalidArgument);
  for (const char* endpoint : {"", "10.9.0.2", "10.9.0.2:0", "10.9.0.2:99999", ":50052"}) {
    GangLease gang = Gang(job, 0, 1, {"a", "b"});
    gang.members[1].endpoint = endpoint;
    EXPECT_CODE(store_->RecordGang(gang), kInvalidArgument) << "endpoint '" << endpoint << "'";
  }
  GangLease negative = Gang(job, 0, 1, {"a", "b"});
  negative.members[1].bytes = -1;
  EXPECT_CODE(store_->RecordGang(negative), kInvalidArgument);
  // A task that does not exist.
  EXPECT_CODE(store_->RecordGang(Gang(job, 7, 1, {"a", "b"})), kNotFound);
  EXPECT_CODE(store_->RecordGang(Gang("job-000000000000", 0, 1, {"a", "b"})), kNotFound);
  ASSERT_OK_AND_ASSIGN(std::vector<GangLease> all, store_->ListGangs());
  EXPECT_THAT(all, IsEmpty());
}


// Migration 9 (jobs.gang_size): a gang job keeps its size, and the ordinary lease query never
// gives its tasks to one executor, however large; single jobs queued behind it still flow.
TEST_P(GangStoreContract, GangJobsKeepTheirSizeAndAreNeverLeasedToOneExecutor) {
  JobSpec gang_spec = Spec(/*priority=*/5);
  gang_spec.gang_size = 2;
  const std::string gang_job = Submit(gang_spec, 2);
  const std::string single_job = Submit(Spec(), 1);
  EXPECT_EQ(GetJob(gang_job).spec.gang_size, 2);
  EXPECT_EQ(GetJob(single_job).spec.gang_size, 0);

  const std::string big = Register("big", 512 * kGiB);
  std::vector<Lease> leases = LeaseUpTo(big, 4);
  ASSERT_THAT(leases, SizeIs(1));
  EXPECT_EQ(leases[0].task.job_id, single_job);
  EXPECT_TRUE(leases[0].gang.empty());

  // The gang path finds the gang job's first pending task, highest priority first.
  ASSERT_OK_AND_ASSIGN(std::optional<GangTaskRef> next, store_->NextGangTask(now_));
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->job.id, gang_job);
  EXPECT_EQ(next->task_index, 0);
  EXPECT_EQ(next->job.spec.gang_size, 2);
}

// A gang attempt holds every executor of its gang: its team's usage grows by the gang's size for
// each second it runs, its team's running tasks by one (the running-task quota counts tasks), and
// when it ends, the job and the team are charged its time on every executor, whatever ends it.
TEST_P(GangStoreContract, AGangAttemptIsChargedOncePerExecutorItHolds) {
  JobSpec spec = Spec();
  spec.gang_size = 3;
  const std::string job = Submit(spec, 3);
  const std::string single = Submit(Spec(), 1);  // the same team's single-machine work, for scale
  const std::string lead = Register("lead"), m1 = Register("m1"), m2 = Register("m2"), other = Register("other");
  auto usage = [&] {
    for (const TeamUsage& u : Must(store_->ListTeamUsage(now_), "ListTeamUsage")) {
      if (u.team == spec.team) return u;
    }
    return TeamUsage{spec.team};
  };
  ASSERT_OK_AND_ASSIGN(Lease lease, store_->LeaseToGang(Gang(job, 0, 0, {lead, m1, m2}), kTtl, now_));
  ASSERT_THAT(LeaseUpTo(other, 1), SizeIs(1));
  EXPECT_EQ(usage().running, 2);
  Advance(absl::Seconds(10));
  EXPECT_LE(absl::AbsDuration(usage().usage - absl::Seconds(40)), absl::Milliseconds(1))
      << "3 executors and 1 for 10 s";

  // A completion charges the gang's 3 × 10 s.
  ASSERT_OK_AND_ASSIGN(auto done, store_->CompleteTasks(lead, {Progress(lease, kRecordsPerTask)}, now_));
  ASSERT_OK(done[0]);
  EXPECT_EQ(GetJob(job).device_time, absl::Seconds(30));
  EXPECT_EQ(usage().device_time, absl::Seconds(30));
  EXPECT_EQ(usage().running, 1);

  // A lease that expires: 3 × 40 s.
  ASSERT_OK(store_->LeaseToGang(Gang(job, 1, 0, {lead, m1, m2}), kTtl, now_).status());
  Advance(absl::Seconds(40));
  ASSERT_OK(store_->ExpireLeases(now_, 10).status());
  EXPECT_EQ(GetJob(job).device_time, absl::Seconds(150));
  EXPECT_EQ(GetJob(single).device_time, absl::Seconds(50)) << "its lease expired too (after 50 s, one executor)";

  // A cancel: the job it answers and the stored one have the gang's 3 × 5 s.
  ASSERT_OK(store_->LeaseToGang(Gang(job, 2, 0, {m2, m1, lead}), kTtl, now_).status());
  Advance(absl::Seconds(5));
  ASSERT_OK_AND_ASSIGN(Job cancelled, store_->CancelJob(job, now_));
  EXPECT_EQ(cancelled.device_time, absl::Seconds(165));
  EXPECT_EQ(GetJob(job).device_time, absl::Seconds(165));
  EXPECT_EQ(usage().device_time, absl::Seconds(215)) << "the gang job's 165 s and the single job's 50 s";
  EXPECT_EQ(usage().running, 0);
  // Nothing runs: the usage is what ended (decayed over 45 s of a day's half-life: a few ms).
  EXPECT_LE(absl::AbsDuration(usage().usage - absl::Seconds(215)), absl::Milliseconds(50)) << usage().usage;
}

TEST_P(GangStoreContract, LeaseToGangGrantsTheLeaderAndSeatsTheGangInOneStep) {
  JobSpec spec = Spec();
  spec.gang_size = 2;
  const std::string job = Submit(spec, 2);
  const auto [lead, member] = RegisterAll({"lead", "member"});
  GangLease gang = Gang(job, 0, 0, {lead, member});

  ASSERT_OK_AND_ASSIGN(Lease lease, store_->LeaseToGang(gang, kTtl, now_));
  EXPECT_EQ(lease.task.job_id, job);
  EXPECT_EQ(lease.task.index, 0);
  EXPECT_EQ(lease.task.attempt, 1);
  EXPECT_EQ(lease.task.executor_id, lead);
  ASSERT_THAT(lease.gang, SizeIs(2));
  EXPECT_EQ(lease.gang[1].endpoint, "10.9.0.1:50052");
  EXPECT_EQ(GetTask(job, 0).state, TaskState::kRunning);
  EXPECT_EQ(GetJob(job).state, JobState::kRunning);
  ASSERT_OK_AND_ASSIGN(GangLease seated, store_->GangOf(member));
  EXPECT_EQ(seated.attempt, 1);
  EXPECT_EQ(seated.leader(), lead);
  EXPECT_EQ(seated.formed_at, now_);

  // The next gang task is task 1; task 0 is not pending any more, nor may its members form
  // another gang while this attempt runs.
  ASSERT_OK_AND_ASSIGN(std::optional<GangTaskRef> next, store_->NextGangTask(now_));
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->task_index, 1);
  EXPECT_CODE(store_->LeaseToGang(gang, kTtl, now_), kFailedPrecondition);
  const std::string other = Register("other");
  EXPECT_CODE(store_->LeaseToGang(Gang(job, 1, 0, {other, member}), kTtl, now_), kFailedPrecondition);
  EXPECT_CODE(store_->GangOf(other), kNotFound);
  EXPECT_EQ(GetTask(job, 1).state, TaskState::kPending);

  // The attempt ends (preempted: back to pending): its seats are stale, and the next gang of
  // the same executors frees them as it forms.
  ASSERT_OK(store_->FailTask(lead, job, 0, 1, FailureClass::kPreempted, "a member went away", now_).status());
  ASSERT_OK_AND_ASSIGN(Lease again, store_->LeaseToGang(Gang(job, 0, 0, {member, lead}), kTtl, now_));
  EXPECT_EQ(again.task.attempt, 2);
  ASSERT_OK_AND_ASSIGN(GangLease reseated, store_->GangOf(lead));
  EXPECT_EQ(reseated.attempt, 2);
  EXPECT_EQ(reseated.leader(), member);
}

TEST_P(GangStoreContract, LeaseToGangRefusesWhatNoGangMayRun) {
  const std::string single = Submit(Spec(), 1);
  JobSpec spec = Spec();
  spec.gang_size = 3;
  const std::string trio = Submit(spec, 1);
  const auto [a, b] = RegisterAll({"a", "b"});
  // A single job, and a gang of the wrong size, are refused; nothing is granted or seated.
  EXPECT_CODE(store_->LeaseToGang(Gang(single, 0, 0, {a, b}), kTtl, now_), kFailedPrecondition);
  EXPECT_CODE(store_->LeaseToGang(Gang(trio, 0, 0, {a, b}), kTtl, now_), kFailedPrecondition);
  EXPECT_CODE(store_->LeaseToGang(Gang(trio, 0, 0, {a}), kTtl, now_), kInvalidArgument);
  EXPECT_EQ(GetTask(trio, 0).state, TaskState::kPending);
  EXPECT_CODE(store_->GangOf(a), kNotFound);
  // A draining leader leases nothing.
  const std::string c = Register("c");
  ASSERT_OK(store_->RequestDrain(a, now_));
  EXPECT_CODE(store_->LeaseToGang(Gang(trio, 0, 0, {a, b, c}), kTtl, now_), kFailedPrecondition);
  ASSERT_OK(store_->CancelJob(trio, now_).status());
  EXPECT_CODE(store_->LeaseToGang(Gang(trio, 0, 0, {b, c, a}), kTtl, now_), kFailedPrecondition);
  ASSERT_OK_AND_ASSIGN(std::optional<GangTaskRef> none, store_->NextGangTask(now_));
  EXPECT_FALSE(none.has_value());
}

}  // namespace
}  // namespace minions

// Why a queued job waits (model/placement.h ExplainWait): each cause, from the fleet's executors,
// their running tasks, the teams' standing and the warm-executor wait. The stores' lease agrees
// with the same rules (tests/store/fair_share_contract.cc, Placement).

#include "model/placement.h"

#include "model/json_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace minions {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kGiB = int64_t{1} << 30;
const absl::Time kSubmitted = absl::FromUnixSeconds(1'700'000'000);
constexpr absl::Duration kWarmWait = absl::Seconds(3);

std::string Digest(char c) { return "sha256:" + std::string(64, c); }

FleetMember Machine(const std::string& id, int64_t usable, ExecutorState state = ExecutorState::kAvailable,
                    int64_t running = 0) {
  FleetMember m;
  m.executor.id = id;
  m.executor.state = state;
  m.executor.info.memory_bytes = 64 * kGiB;
  m.executor.info.usable_memory_bytes = usable;
  m.executor.info.max_tasks = 1;
  m.running_tasks = running;
  return m;
}

Job Queued(int64_t memory, const std::string& digest = "", const std::string& runner = "llama") {
  Job job;
  job.id = "job-1";
  job.state = JobState::kQueued;
  job.created_at = kSubmitted;
  job.spec.team = "search";
  job.spec.model = "llama-3b";
  job.spec.model_digest = digest;
  job.spec.requirements.min_memory_bytes = memory;
  job.spec.requirements.runner = runner;
  return job;
}

WaitExplanation Explain(const Job& job, const std::vector<FleetMember>& fleet, absl::Duration since_submit = {},
                        const std::vector<TeamUsage>& teams = {}) {
  return ExplainWait(job, 1, fleet, teams, kSubmitted + since_submit, kWarmWait);
}

TEST(ExplainWait, AJobWithNothingPendingOrEndedDoesNotWait) {
  EXPECT_EQ(ExplainWait(Queued(kGiB), 0, {}, {}, kSubmitted, kWarmWait).cause, WaitCause::kNotWaiting);
  Job done = Queued(kGiB);
  done.state = JobState::kCompleted;
  EXPECT_EQ(ExplainWait(done, 3, {}, {}, kSubmitted, kWarmWait).cause, WaitCause::kNotWaiting);
  EXPECT_EQ(WaitCauseName(WaitCause::kNotWaiting), "");
}

TEST(ExplainWait, NoExecutorEnrolledYet) {
  WaitExplanation why = Explain(Queued(kGiB), {Machine("gone", 64 * kGiB, ExecutorState::kRevoked)});
  EXPECT_EQ(why.cause, WaitCause::kNoExecutors);
  EXPECT_EQ(WaitCauseName(why.cause), "no_executors");
}

TEST(ExplainWait, NoExecutorCanHoldTheModelSaysTheFigures) {
  WaitExplanation why = Explain(Queued(40 * kGiB), {Machine("a", 16 * kGiB), Machine("b", 24 * kGiB)});
  EXPECT_EQ(why.cause, WaitCause::kTooLarge);
  EXPECT_EQ(WaitCauseName(why.cause), "too_large");
  EXPECT_THAT(why.message, HasSubstr("40.00 GiB"));
  EXPECT_THAT(why.message, HasSubstr("24.00 GiB"));
}

TEST(ExplainWait, NoExecutorOffersTheRunner) {
  WaitExplanation why = Explain(Queued(kGiB, "", "vllm"), {Machine("a", 64 * kGiB)});
  EXPECT_EQ(why.cause, WaitCause::kNoRunner);
  EXPECT_THAT(why.message, HasSubstr("'vllm'"));
}

TEST(ExplainWait, AllAbleExecutorsBusyAwayOrDraining) {
  FleetMember draining = Machine("d", 64 * kGiB);
  draining.executor.drain_requested = true;
  const std::vector<FleetMember> fleet = {
      Machine("busy", 64 * kGiB, ExecutorState::kBusy, 1), Machine("away", 64 * kGiB, ExecutorState::kOwnerActive),
      Machine("lost", 64 * kGiB, ExecutorState::kLost), draining,
      Machine("small", 2 * kGiB)};  // free, but cannot hold it
  WaitExplanation why = Explain(Queued(8 * kGiB), fleet);
  EXPECT_EQ(why.cause, WaitCause::kAllBusy);
  EXPECT_THAT(why.message, HasSubstr("all 4 executors"));
}

// A busy executor with room for more takes the job's tasks as its own work runs low: the line says
// so, and never calls it free while `minions executors` shows it busy (issue 39, point 3).
TEST(ExplainWait, ABusyExecutorWithAFreeSlotCanTakeIt) {
  FleetMember two_slots = Machine("busy", 64 * kGiB, ExecutorState::kBusy, 1);
  two_slots.executor.info.max_tasks = 2;
  WaitExplanation busy = Explain(Queued(8 * kGiB), {two_slots, two_slots});
  EXPECT_EQ(busy.cause, WaitCause::kInLine);
  EXPECT_THAT(busy.message, HasSubstr("2 executors that can run it are busy and take its next tasks as the work they "
                                      "hold run low"));
  EXPECT_THAT(busy.message, Not(HasSubstr("free")));
  // One idle among them: that one is free, and takes it at its next request.
  WaitExplanation idle = Explain(Queued(8 * kGiB), {two_slots, Machine("idle", 64 * kGiB)});
  EXPECT_EQ(idle.cause, WaitCause::kInLine);
  EXPECT_THAT(idle.message, HasSubstr("1 free executor can run it"));
}

TEST(ExplainWait, WaitingForAWarmExecutorUntilTheDelayIsOver) {
  FleetMember warm = Machine("warm", 64 * kGiB, ExecutorState::kBusy, 1);
  warm.executor.info.models = {Digest('a')};
  const std::vector<FleetMember> fleet = {warm, Machine("cold", 64 * kGiB)};
  WaitExplanation why = Explain(Queued(8 * kGiB, Digest('a')), fleet, absl::Seconds(1));
  EXPECT_EQ(why.cause, WaitCause::kWarmWait);
  EXPECT_THAT(why.message, HasSubstr("model llama-3b (one that has it loaded, or cached with no other model loaded); 1 is, busy"));
  EXPECT_THAT(why.message, HasSubstr("2023-11-14T22:13:23"));  // submitted + the 3 s wait
  // Once the wait is over the cold one may take it.
  EXPECT_EQ(Explain(Queued(8 * kGiB, Digest('a')), fleet, kWarmWait).cause, WaitCause::kInLine);
  // A free warm executor takes it at once; a job named by path waits for no warm executor.
  warm.running_tasks = 0;
  EXPECT_EQ(Explain(Queued(8 * kGiB, Digest('a')), {warm, Machine("cold", 64 * kGiB)}).cause, WaitCause::kInLine);
  EXPECT_EQ(Explain(Queued(8 * kGiB), {Machine("cold", 64 * kGiB)}).cause, WaitCause::kInLine);
}

TEST(ExplainWait, TheTeamRunsItsQuotaOfTasks) {
  TeamUsage search;
  search.team = "search";
  search.max_running_tasks = 2;
  search.running = 2;
  WaitExplanation why = Explain(Queued(kGiB), {Machine("a", 64 * kGiB)}, {}, {search});
  EXPECT_EQ(why.cause, WaitCause::kTeamQuota);
  EXPECT_THAT(why.message, HasSubstr("quota of 2"));
  search.running = 1;
  EXPECT_EQ(Explain(Queued(kGiB), {Machine("a", 64 * kGiB)}, {}, {search}).cause, WaitCause::kInLine);
}

TEST(PlaceOn, RunnerMemoryAndWarmth) {
  ExecutorInfo info;
  info.memory_bytes = 64 * kGiB;
  info.usable_memory_bytes = 16 * kGiB;
  info.models = {Digest('b')};
  info.model_loaded = Digest('a');
  const absl::Time early = kSubmitted + absl::Seconds(1);
  EXPECT_EQ(PlaceOn(info, Queued(16 * kGiB, Digest('a')), early, kWarmWait), Fit::kFits);
  EXPECT_EQ(PlaceOn(info, Queued(16 * kGiB + 1, Digest('a')), early, kWarmWait), Fit::kTooSmall);
  EXPECT_EQ(PlaceOn(info, Queued(kGiB, Digest('a'), "custom"), early, kWarmWait), Fit::kNoRunner);
  // Cached, but model a is loaded: taking it would unload a, so it waits out the delay too.
  EXPECT_EQ(PlaceOn(info, Queued(kGiB, Digest('b')), early, kWarmWait), Fit::kColdTooEarly);
  EXPECT_EQ(PlaceOn(info, Queued(kGiB, Digest('b')), kSubmitted + kWarmWait, kWarmWait), Fit::kFits);
  ExecutorInfo idle = info;  // cached with nothing loaded: a load that unloads nothing
  idle.model_loaded.clear();
  EXPECT_EQ(PlaceOn(idle, Queued(kGiB, Digest('b')), early, kWarmWait), Fit::kFits);
  EXPECT_TRUE(TakesWithoutWait(idle, Digest('b')));
  EXPECT_FALSE(TakesWithoutWait(info, Digest('b')));
  EXPECT_EQ(PlaceOn(info, Queued(kGiB, Digest('c')), early, kWarmWait), Fit::kColdTooEarly);
  EXPECT_EQ(PlaceOn(info, Queued(kGiB, Digest('c')), kSubmitted + kWarmWait, kWarmWait), Fit::kFits);
  EXPECT_EQ(WarmthOf(info, Digest('a')), Warmth::kLoaded);
  EXPECT_EQ(WarmthOf(info, Digest('b')), Warmth::kCached);
  EXPECT_EQ(WarmthOf(info, ""), Warmth::kLoaded);
}

// 40.6a: a job that requires confinement fits only a fully confined executor; one that does not
// fits any; and the requirement survives the job's stored form.
TEST(PlaceOn, AJobThatRequiresConfinementFitsOnlyAFullyConfinedExecutor) {
  Job job = Queued(kGiB);
  job.spec.requirements.confined = true;
  ExecutorInfo info;
  info.memory_bytes = info.usable_memory_bytes = 16 * kGiB;
  for (const char* confinement : {"", kConfinementNone, kConfinementPartial, "totally"}) {
    info.confinement = confinement;
    EXPECT_EQ(PlaceOn(info, job, kSubmitted, kWarmWait), Fit::kUnconfined) << confinement;
    EXPECT_EQ(PlaceOn(info, Queued(kGiB), kSubmitted, kWarmWait), Fit::kFits) << confinement;
  }
  info.confinement = kConfinementFull;
  EXPECT_EQ(PlaceOn(info, job, kSubmitted, kWarmWait), Fit::kFits);
  absl::StatusOr<JobSpec> stored = JobSpecFromJson(JobSpecToJson(job.spec));
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->requirements.confined);
  EXPECT_FALSE(JobSpecFromJson(JobSpecToJson(Queued(kGiB).spec))->requirements.confined);
}

}  // namespace
}  // namespace minions

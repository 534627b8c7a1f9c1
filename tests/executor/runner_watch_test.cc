// RunnerWatch: when a silent runner is hung.

#include "executor/runner_watch.h"

#include <gtest/gtest.h>

namespace minions {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

RunnerWatch::Options Limits() {
  RunnerWatch::Options options;
  options.min_silence = absl::Seconds(30);
  options.max_silence = absl::Minutes(10);
  options.factor = 10;
  return options;
}

TEST(RunnerWatch, ARunnerWithoutWorkIsNeverHung) {
  RunnerWatch watch(Limits());
  EXPECT_EQ(watch.HungAt(), absl::InfiniteFuture());
  EXPECT_FALSE(watch.Hung(kT0 + absl::Hours(5)));
}

TEST(RunnerWatch, SilenceCountsFromTheWorkSentToAnIdleRunner) {
  RunnerWatch watch(Limits());
  watch.Sent(kT0);
  watch.Sent(kT0 + absl::Seconds(20));  // more work for a busy runner does not reset it
  EXPECT_FALSE(watch.Hung(kT0 + absl::Seconds(29)));
  EXPECT_TRUE(watch.Hung(kT0 + absl::Seconds(30)));
  EXPECT_EQ(watch.Silence(kT0 + absl::Seconds(30)), absl::Seconds(30));
}

TEST(RunnerWatch, TheLimitFollowsHowLongItsRecordsTake) {
  RunnerWatch watch(Limits());
  watch.Sent(kT0);
  watch.Heard(kT0 + absl::Seconds(10), true);  // slow records: 10 s apart
  watch.Heard(kT0 + absl::Seconds(20), true);
  EXPECT_EQ(watch.limit(), absl::Seconds(100));
  EXPECT_FALSE(watch.Hung(kT0 + absl::Seconds(119)));
  EXPECT_TRUE(watch.Hung(kT0 + absl::Seconds(120)));
  watch.Heard(kT0 + absl::Seconds(200), true);  // a record of 180 s: never more than the ceiling
  EXPECT_EQ(watch.limit(), absl::Minutes(10));
}

TEST(RunnerWatch, IdleTimeAndTimeStoppedForTheOwnerAreNoSilence) {
  RunnerWatch watch(Limits());
  watch.Sent(kT0);
  watch.Heard(kT0 + absl::Seconds(1), false);  // done: idle
  EXPECT_EQ(watch.HungAt(), absl::InfiniteFuture());
  watch.Sent(kT0 + absl::Minutes(5));
  watch.Pause();
  EXPECT_FALSE(watch.Hung(kT0 + absl::Hours(1)));
  watch.Resume(kT0 + absl::Hours(1));
  EXPECT_FALSE(watch.Hung(kT0 + absl::Hours(1) + absl::Seconds(29)));
  EXPECT_TRUE(watch.Hung(kT0 + absl::Hours(1) + absl::Seconds(30)));
  watch.Idle();
  EXPECT_FALSE(watch.Hung(kT0 + absl::Hours(2)));
}

}  // namespace
}  // namespace minions

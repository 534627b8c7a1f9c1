// The clock seam: waits end by the condition or by the clock's own time, never by real time
// behind its back.

#include <thread>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "testing/fake_clock.h"

namespace minions::testing {
namespace {

// A flag under a mutex, waited for with a deadline on `clock`.
struct Flag {
  absl::Mutex mu;
  bool set ABSL_GUARDED_BY(mu) = false;
  bool Wait(Clock& clock, absl::Time deadline) {
    absl::MutexLock lock(&mu);
    auto is_set = [this] {
      mu.AssertHeld();
      return set;
    };
    return clock.AwaitWithDeadline(mu, absl::Condition(&is_set), deadline);
  }
  void Set() {
    absl::MutexLock lock(&mu);
    set = true;
  }
};

TEST(FakeClock, AWaitEndsWhenItsConditionHoldsWithoutTimePassing) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  Flag flag;
  bool answer = false;
  std::thread waiter([&] { answer = flag.Wait(clock, clock.Now() + absl::Hours(1)); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  flag.Set();
  waiter.join();
  EXPECT_TRUE(answer);
  EXPECT_EQ(clock.Now(), start);
  EXPECT_EQ(clock.waiters(), 0);
}

TEST(FakeClock, AWaitEndsWhenTheClockPassesItsDeadline) {
  FakeClock clock;
  Flag flag;
  bool answer = true;
  std::thread waiter([&] { answer = flag.Wait(clock, clock.Now() + absl::Seconds(30)); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  clock.Advance(absl::Seconds(29));
  EXPECT_EQ(clock.waiters(), 1) << "woken before its deadline";
  clock.Advance(absl::Seconds(1));
  waiter.join();
  EXPECT_FALSE(answer);
}

TEST(FakeClock, AdvanceToNextDeadlineGoesToTheEarliestSleeper) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  EXPECT_FALSE(clock.AdvanceToNextDeadline()) << "nobody sleeps";
  std::thread sleeper([&] { clock.SleepFor(absl::Milliseconds(250)); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  EXPECT_TRUE(clock.AdvanceToNextDeadline());
  sleeper.join();
  EXPECT_EQ(clock.Now() - start, absl::Milliseconds(250));
}

TEST(FakeClock, WakeEndsSleeps) {
  FakeClock clock;
  bool woken = false;
  std::thread sleeper([&] { woken = clock.SleepFor(absl::Hours(1)); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  clock.Wake();
  sleeper.join();
  EXPECT_TRUE(woken);
}

TEST(FakeClock, ADeadlineAlreadyPassedAnswersAtOnce) {
  FakeClock clock;
  Flag flag;
  EXPECT_FALSE(flag.Wait(clock, clock.Now()));
  flag.Set();
  EXPECT_TRUE(flag.Wait(clock, clock.Now() - absl::Seconds(1)));
}

TEST(RealClock, AWaitAnswersTheConditionAtItsDeadline) {
  RealClock clock;
  Flag flag;
  EXPECT_FALSE(flag.Wait(clock, clock.Now() - absl::Seconds(1)));
  std::thread setter([&] { flag.Set(); });
  EXPECT_TRUE(flag.Wait(clock, absl::InfiniteFuture()));
  setter.join();
}

}  // namespace
}  // namespace minions::testing

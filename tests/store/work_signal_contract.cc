#include "work_signal_contract.h"

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace minions {
namespace {

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(WorkSignalContract);

// Counts a watcher's wake-ups.
class Wakeups {
 public:
  std::function<void()> Callback() {
    return [this] {
      absl::MutexLock lock(&mu_);
      ++count_;
    };
  }
  int count() {
    absl::MutexLock lock(&mu_);
    return count_;
  }
  // Whether a wake-up beyond `seen` came within `wait` (a wait for an event, not a measurement).
  bool AwaitMoreThan(int seen, absl::Duration wait) {
    absl::MutexLock lock(&mu_);
    auto more = [&] {
      mu_.AssertHeld();
      return count_ > seen;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&more), wait);
  }

 private:
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Announces from `from` until `to` hears it (a listener may not be listening yet when the first
// goes out); false if it never does.
bool AnnounceUntilHeard(WorkSignal& from, Wakeups& to) {
  const int before = to.count();
  for (int tries = 0; tries < 300; ++tries) {
    EXPECT_TRUE(from.Announce().ok());
    if (to.AwaitMoreThan(before, absl::Milliseconds(100))) return true;
  }
  return false;
}

TEST_P(WorkSignalContract, AnAnnouncementReachesTheOtherServersWatchers) {
  std::unique_ptr<WorkSignal> a = place_(), b = place_(), c = place_();
  ASSERT_TRUE(a && b && c);
  Wakeups heard_b, heard_c;
  ASSERT_TRUE(b->Start(heard_b.Callback()).ok());
  ASSERT_TRUE(c->Start(heard_c.Callback()).ok());
  EXPECT_TRUE(AnnounceUntilHeard(*a, heard_b));
  EXPECT_TRUE(AnnounceUntilHeard(*a, heard_c));
  // Both ways: a watcher's own server announces too.
  Wakeups heard_a;
  ASSERT_TRUE(a->Start(heard_a.Callback()).ok());
  EXPECT_TRUE(AnnounceUntilHeard(*b, heard_a));
  EXPECT_FALSE(a->Start(heard_a.Callback()).ok()) << "started twice";
  b->Stop();
  b->Stop();  // idempotent
}

TEST_P(WorkSignalContract, AnAnnouncementWithNobodyWatchingIsHarmless) {
  std::unique_ptr<WorkSignal> a = place_();
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->Announce().ok());
  EXPECT_TRUE(a->Announce().ok());
}

}  // namespace
}  // namespace minions

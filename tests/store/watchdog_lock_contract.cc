#include "watchdog_lock_contract.h"

namespace minions {
namespace {

using ::testing::HasSubstr;

TEST_P(WatchdogLockContract, OneHolderAtATime) {
  absl::StatusOr<std::unique_ptr<WatchdogLock>> first = place_.try_acquire();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE((*first)->Check().ok());
  absl::StatusOr<std::unique_ptr<WatchdogLock>> second = place_.try_acquire();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("another watchdog"));
  // Refusing does not disturb the holder.
  EXPECT_EQ(place_.try_acquire().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE((*first)->Check().ok());

  first->reset();  // the holder goes away: the lock is free
  absl::StatusOr<std::unique_ptr<WatchdogLock>> third = place_.try_acquire();
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE((*third)->Check().ok());
  EXPECT_EQ(place_.try_acquire().status().code(), absl::StatusCode::kUnavailable);
}

TEST_P(WatchdogLockContract, AHolderThatLostItsLockLearnsSoAndForGood) {
  absl::StatusOr<std::unique_ptr<WatchdogLock>> holder = place_.try_acquire();
  ASSERT_TRUE(holder.ok()) << holder.status();
  ASSERT_TRUE((*holder)->Check().ok());
  place_.sever();
  absl::Status lost = (*holder)->Check();
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_THAT(std::string(lost.message()), HasSubstr("lost"));
  // Another may take it now; the old holder never holds it again.
  absl::StatusOr<std::unique_ptr<WatchdogLock>> next;
  for (int tries = 0; tries < 500 && !next.ok(); ++tries) next = place_.try_acquire();  // a severed session ends asynchronously
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE((*next)->Check().ok());
  EXPECT_EQ((*holder)->Check().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace minions

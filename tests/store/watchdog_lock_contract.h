#pragma once
// The WatchdogLock contract (store/watchdog_lock.h): one suite every backend's lock passes. A
// backend's test file instantiates it with a factory of a fresh place to lock (a database file,
// a schema):
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, WatchdogLockContract,
//                            ::testing::Values(LockPlacesOf<SqliteWatchdogLock>(fresh, sever)));

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "place_contract.h"
#include "store/watchdog_lock.h"

namespace minions {

// One place to lock, as a backend's test makes it.
struct WatchdogLockPlace {
  // TryAcquire of the backend's lock on this place.
  std::function<absl::StatusOr<std::unique_ptr<WatchdogLock>>()> try_acquire;
  // Takes the lock away from its holder behind its back, as can happen to this backend (the
  // holder's database session ends; its lock file is removed).
  std::function<void()> sever;
};
using WatchdogLockFactory = std::function<WatchdogLockPlace()>;

// The factory of a backend whose `Lock::TryAcquire(where)` answers its own lock type: each test
// locks a fresh place, `fresh()`, and `sever(where)` takes the lock away there.
template <typename Lock>
WatchdogLockFactory LockPlacesOf(std::function<std::string()> fresh, std::function<void(const std::string&)> sever) {
  return [fresh, sever] {
    const std::string where = fresh();
    return WatchdogLockPlace{[where]() -> absl::StatusOr<std::unique_ptr<WatchdogLock>> {
                               auto lock = Lock::TryAcquire(where);
                               if (!lock.ok()) return lock.status();
                               return std::unique_ptr<WatchdogLock>(std::move(*lock));
                             },
                             [where, sever] { sever(where); }};
  };
}
inline void PrintTo(const WatchdogLockFactory&, std::ostream* os) { *os << "a watchdog lock factory"; }

class WatchdogLockContract : public PlaceContract<WatchdogLockPlace> {};

}  // namespace minions

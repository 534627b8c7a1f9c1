#pragma once
// The WorkSignal contract (store/work_signal.h): one suite every backend's signal passes. A
// backend's test file instantiates it with a factory of a fresh store place, which opens any
// number of signals on it (each one a server's).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>

#include "place_contract.h"
#include "store/work_signal.h"

namespace minions {

// Opens one more signal on the factory's place (a server of its own on one store).
using WorkSignalOpener = std::function<std::unique_ptr<WorkSignal>()>;
using WorkSignalFactory = std::function<WorkSignalOpener()>;
inline void PrintTo(const WorkSignalFactory&, std::ostream* os) { *os << "a work signal factory"; }

// place_() opens one more signal on the test's store.
class WorkSignalContract : public PlaceContract<WorkSignalOpener> {};

}  // namespace minions

// Placement at submit (server/model_registry.h CheckFleetCanHold): a job no executor of the fleet
// could ever run is refused with the reason, instead of waiting for ever.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/model_registry.h"

namespace minions {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

Executor Machine(int64_t memory, int64_t usable, std::vector<std::string> runners,
                 ExecutorState state = ExecutorState::kAvailable) {
  Executor e;
  e.id = "exe-1";
  e.state = state;
  e.info.memory_bytes = memory;
  e.info.usable_memory_bytes = usable;
  e.info.runners = std::move(runners);
  return e;
}

JobSpec Needing(int64_t bytes, const std::string& runner = "llama") {
  JobSpec spec;
  spec.requirements.min_memory_bytes = bytes;
  spec.requirements.runner = runner;
  return spec;
}

TEST(CheckFleetCanHold, AnEmptyFleetTakesAnyJob) {
  EXPECT_TRUE(CheckFleetCanHold({}, Needing(512 * kGiB)).ok());
  // Revoked machines are not the fleet.
  EXPECT_TRUE(CheckFleetCanHold({Machine(8 * kGiB, 0, {"llama"}, ExecutorState::kRevoked)}, Needing(512 * kGiB)).ok());
}

TEST(CheckFleetCanHold, OneMachineThatHoldsItIsEnoughEvenIfBusyOrAway) {
  EXPECT_TRUE(CheckFleetCanHold({Machine(8 * kGiB, 0, {"llama"}),
                                 Machine(64 * kGiB, 48 * kGiB, {"llama"}, ExecutorState::kOwnerActive)},
                                Needing(40 * kGiB))
                  .ok());
}

TEST(CheckFleetCanHold, TooLargeForEveryUsableMemoryIsRefusedWithTheFigures) {
  // 64 GiB of RAM but 16 usable (the owner's limits): usable memory is what counts.
  absl::Status refused = CheckFleetCanHold({Machine(64 * kGiB, 16 * kGiB, {"llama"})}, Needing(40 * kGiB));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("40.00 GiB"));
  EXPECT_THAT(refused.message(), HasSubstr("16.00 GiB"));
}

TEST(CheckFleetCanHold, ARunnerNoExecutorOffersIsRefused) {
  absl::Status refused = CheckFleetCanHold({Machine(64 * kGiB, 0, {"llama"})}, Needing(kGiB, "vllm"));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("'vllm'"));
  // An executor that names no runner runs the default one.
  EXPECT_TRUE(CheckFleetCanHold({Machine(64 * kGiB, 0, {})}, Needing(kGiB, Requirements{}.runner)).ok());
}

}  // namespace
}  // namespace minions

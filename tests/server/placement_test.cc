// Placement at submit (server/model_registry.h CheckFleetCanHold): a job no executor of the fleet
// could ever run is refused with the reason, instead of waiting for ever; a model no single
// executor holds gets the fewest executors that do as a gang (PlanAutomaticGang).

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

Executor GangMachine(const std::string& id, int64_t usable, const std::string& gang_address = "10.9.0.1:50052") {
  Executor e = Machine(usable, usable, {"llama"});
  e.id = id;
  e.info.gang_address = gang_address;
  return e;
}

TEST(PlanAutomaticGang, AModelNoOneExecutorHoldsGetsTheFewestThatDo) {
  std::vector<Executor> fleet = {GangMachine("a", 16 * kGiB), GangMachine("b", 24 * kGiB),
                                 GangMachine("c", 16 * kGiB), GangMachine("d", 8 * kGiB)};
  JobSpec spec = Needing(40 * kGiB);
  PlanAutomaticGang(fleet, spec);
  EXPECT_EQ(spec.gang_size, 2);  // 24 + 16
  EXPECT_TRUE(CheckFleetCanHold(fleet, spec).ok());
  spec = Needing(50 * kGiB);
  PlanAutomaticGang(fleet, spec);
  EXPECT_EQ(spec.gang_size, 3);  // 24 + 16 + 16
  EXPECT_TRUE(CheckFleetCanHold(fleet, spec).ok());
  // One that one executor holds stays a single-machine job; a job that asked for a gang keeps it.
  spec = Needing(20 * kGiB);
  PlanAutomaticGang(fleet, spec);
  EXPECT_EQ(spec.gang_size, 0);
  spec = Needing(kGiB);
  spec.gang_size = 4;
  PlanAutomaticGang(fleet, spec);
  EXPECT_EQ(spec.gang_size, 4);
}

TEST(PlanAutomaticGang, StillRefusedWhenTheWholeFleetCannotHoldIt) {
  // 64 GiB in all, but only executors with a gang address join gangs: 40 GiB of them.
  std::vector<Executor> fleet = {GangMachine("a", 16 * kGiB), GangMachine("b", 24 * kGiB),
                                 GangMachine("c", 24 * kGiB, "")};
  JobSpec spec = Needing(48 * kGiB);
  PlanAutomaticGang(fleet, spec);
  EXPECT_EQ(spec.gang_size, 0);
  absl::Status refused = CheckFleetCanHold(fleet, spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("48.00 GiB"));
  // Revoked executors are not the fleet.
  fleet.push_back(GangMachine("d", 24 * kGiB));
  fleet.back().state = ExecutorState::kRevoked;
  PlanAutomaticGang(fleet, spec);
  EXPECT_EQ(spec.gang_size, 0);
}

TEST(CheckFleetCanHold, AGangJobIsCheckedAgainstItsGang) {
  std::vector<Executor> fleet = {GangMachine("a", 16 * kGiB), GangMachine("b", 24 * kGiB),
                                 GangMachine("c", 8 * kGiB)};
  JobSpec spec = Needing(40 * kGiB);
  spec.gang_size = 2;
  EXPECT_TRUE(CheckFleetCanHold(fleet, spec).ok());
  spec.gang_size = 4;  // more executors than can join
  EXPECT_EQ(CheckFleetCanHold(fleet, spec).code(), absl::StatusCode::kFailedPrecondition);
  spec = Needing(41 * kGiB);
  spec.gang_size = 2;
  absl::Status refused = CheckFleetCanHold(fleet, spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("40.00 GiB"));
  // Without a gang address no executor joins a gang.
  for (Executor& e : fleet) e.info.gang_address.clear();
  spec.gang_size = 2;
  EXPECT_EQ(CheckFleetCanHold(fleet, spec).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace minions

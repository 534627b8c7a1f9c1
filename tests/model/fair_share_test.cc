#include "model/fair_share.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

TEST(DecayUsage, HalvesEveryHalfLife) {
  const absl::Duration h = absl::Hours(1);
  EXPECT_EQ(DecayUsage(absl::Seconds(100), kT0, kT0, h), absl::Seconds(100));
  EXPECT_EQ(DecayUsage(absl::Seconds(100), kT0, kT0 + h, h), absl::Seconds(50));
  EXPECT_EQ(DecayUsage(absl::Seconds(100), kT0, kT0 + 2 * h, h), absl::Seconds(25));
  // Time never runs backwards here, and a half-life of zero means no decay.
  EXPECT_EQ(DecayUsage(absl::Seconds(100), kT0, kT0 - h, h), absl::Seconds(100));
  EXPECT_EQ(DecayUsage(absl::Seconds(100), kT0, kT0 + h, absl::ZeroDuration()), absl::Seconds(100));
  // Long forgotten is zero, not an error.
  EXPECT_EQ(DecayUsage(absl::Seconds(100), absl::UnixEpoch(), kT0, absl::Seconds(60)), absl::ZeroDuration());
}

TEST(FairShareRanks, LowestUsagePerWeightFirst) {
  std::vector<TeamUsage> teams = {
      {"a", 1, 0, absl::Seconds(100), 0},  // 100 per weight
      {"b", 4, 0, absl::Seconds(200), 0},  // 50 per weight
      {"c", 1, 0, absl::Seconds(10), 0},   // 10 per weight
  };
  EXPECT_THAT(FairShareRanks(teams), ElementsAre(Pair("a", 2), Pair("b", 1), Pair("c", 0)));
}

TEST(FairShareRanks, TiesGoToFewerRunningTasksPerWeightThenName) {
  std::vector<TeamUsage> teams = {
      {"a", 1, 0, absl::ZeroDuration(), 2},  // 2 per weight
      {"b", 3, 0, absl::ZeroDuration(), 3},  // 1 per weight
      {"c", 1, 0, absl::ZeroDuration(), 1},  // 1 per weight, but "b" < "c"
  };
  EXPECT_THAT(FairShareRanks(teams), ElementsAre(Pair("a", 2), Pair("b", 0), Pair("c", 1)));
}

TEST(FairShareRanks, ATeamAtItsRunningQuotaIsNotServed) {
  std::vector<TeamUsage> teams = {
      {"a", 1, 2, absl::ZeroDuration(), 2},
      {"b", 1, 3, absl::Seconds(50), 2},
      {"c", 1, 0, absl::Seconds(99), 500},
  };
  EXPECT_THAT(FairShareRanks(teams), ElementsAre(Pair("a", -1), Pair("b", 0), Pair("c", 1)));
}

TEST(TargetShares, WeightOverTheSumOfWeights) {
  std::vector<TeamUsage> teams = {{"a", 1}, {"b", 3}};
  EXPECT_THAT(TargetShares(teams), ElementsAre(Pair("a", 0.25), Pair("b", 0.75)));
}

}  // namespace
}  // namespace minions

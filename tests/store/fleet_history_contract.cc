// The MetadataStore contract's dashboard-history scenarios (issue 39, point 4): a point per time,
// the first server to record a step wins, old points are pruned, readers get them oldest first.
// Every backend runs them (metadata_store_contract.h).

#include "metadata_store_contract.h"

namespace minions {
namespace {

TEST_P(MetadataStoreContract, FleetHistoryKeepsOnePointPerTimeOldestFirst) {
  const absl::Time t0 = now_;
  ASSERT_OK(store_->RecordFleetHistory({t0 + absl::Seconds(15), R"({"n":2})"}, t0 - absl::Hours(1)));
  ASSERT_OK(store_->RecordFleetHistory({t0, R"({"n":1})"}, t0 - absl::Hours(1)));
  // Another server reaching the same step: the first point stays.
  ASSERT_OK(store_->RecordFleetHistory({t0, R"({"n":"other"})"}, t0 - absl::Hours(1)));
  ASSERT_OK_AND_ASSIGN(std::vector<FleetHistoryRow> rows, store_->ListFleetHistory(t0 - absl::Hours(1)));
  ASSERT_THAT(rows, SizeIs(2));
  EXPECT_EQ(rows[0], (FleetHistoryRow{t0, R"({"n":1})"}));
  EXPECT_EQ(rows[1], (FleetHistoryRow{t0 + absl::Seconds(15), R"({"n":2})"}));
  // `since` is inclusive.
  EXPECT_THAT(Must(store_->ListFleetHistory(t0 + absl::Seconds(15)), "ListFleetHistory"), SizeIs(1));
}

TEST_P(MetadataStoreContract, FleetHistoryPrunesPointsOlderThanKept) {
  const absl::Time t0 = now_;
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(store_->RecordFleetHistory({t0 + absl::Minutes(i), "{}"}, absl::InfinitePast()));
  }
  // Recording the next point drops those before keep_after: the history stays bounded.
  ASSERT_OK(store_->RecordFleetHistory({t0 + absl::Minutes(5), "{}"}, t0 + absl::Minutes(3)));
  ASSERT_OK_AND_ASSIGN(std::vector<FleetHistoryRow> rows, store_->ListFleetHistory(absl::InfinitePast()));
  ASSERT_THAT(rows, SizeIs(3));
  EXPECT_EQ(rows.front().at, t0 + absl::Minutes(3));
  EXPECT_EQ(rows.back().at, t0 + absl::Minutes(5));
}

// Tokens per step: every server adds its own (the counts sum), per team; old steps are pruned.
TEST_P(MetadataStoreContract, FleetTokensSumEveryServersCountsPerStepAndTeam) {
  const absl::Time t0 = now_;
  ASSERT_OK(store_->AddFleetTokens(t0, {{"ml", {10, 5}}, {"ads", {1, 1}}}, absl::InfinitePast()));
  ASSERT_OK(store_->AddFleetTokens(t0, {{"ml", {3, 2}}}, absl::InfinitePast()));  // a second server
  ASSERT_OK(store_->AddFleetTokens(t0 + absl::Seconds(15), {{"ml", {7, 7}}}, absl::InfinitePast()));
  ASSERT_OK_AND_ASSIGN(std::vector<FleetTokensRow> rows, store_->ListFleetTokens(absl::InfinitePast()));
  ASSERT_THAT(rows, SizeIs(3));
  EXPECT_EQ(rows[0], (FleetTokensRow{t0, "ads", {1, 1}}));
  EXPECT_EQ(rows[1], (FleetTokensRow{t0, "ml", {13, 7}}));
  EXPECT_EQ(rows[2], (FleetTokensRow{t0 + absl::Seconds(15), "ml", {7, 7}}));
  EXPECT_THAT(Must(store_->ListFleetTokens(t0 + absl::Seconds(15)), "ListFleetTokens"), SizeIs(1));
  // Adding to a later step drops the steps before keep_after.
  ASSERT_OK(store_->AddFleetTokens(t0 + absl::Seconds(30), {{"ml", {1, 0}}}, t0 + absl::Seconds(15)));
  ASSERT_OK_AND_ASSIGN(rows, store_->ListFleetTokens(absl::InfinitePast()));
  ASSERT_THAT(rows, SizeIs(2));
  EXPECT_EQ(rows.front().at, t0 + absl::Seconds(15));
}

}  // namespace
}  // namespace minions

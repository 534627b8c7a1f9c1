#pragma once
// Fair share between teams: which team an idle executor serves first.
//
// Each team has a weight (Team::weight). Its usage is the device time its attempts ran (run time ×
// the executors each held: a gang job's gang size, else one; a straggler raced by a backup counts
// up to the backup request, and after it only if it wins: store_rules EndedAttemptTime), decayed
// exponentially with a half-life, as HTCondor's user priorities are:
// usage(t) = Σ device_time_i × 2^-((t - end_i) / half_life), plus the device time its running
// attempts have used so far. A team's standing is usage / weight; the lease query
// serves the team with the lowest standing first (the one furthest below its share), then by
// job priority and age within the team. A team at its max_running_tasks is not served.
// Over time each team that keeps wanting work gets a fraction weight / Σ weights of the fleet;
// a team alone on the fleet gets all of it, and a newcomer (no usage) is served first.
//
// Pure functions; any thread.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace minions {

// HTCondor's default (PRIORITY_HALFLIFE: one day).
inline constexpr absl::Duration kDefaultFairShareHalfLife = absl::Hours(24);

// One team's standing as a store reports it (MetadataStore::ListTeamUsage).
struct TeamUsage {
  std::string team;
  int64_t weight = 1;
  int64_t max_running_tasks = 0;  // 0: no limit
  absl::Duration usage;           // decayed device time as of the reading, running attempts included
  int64_t running = 0;            // tasks running now
  // Every ended attempt's device time, never decayed: what the team has used, for accounting
  // (chargeback, reports). Running attempts are not in it until they end, so it only grows.
  absl::Duration device_time;
  bool operator==(const TeamUsage&) const = default;
};

// `usage` recorded at `at`, decayed to `now` (no decay for now <= at; a non-positive half-life: none).
absl::Duration DecayUsage(absl::Duration usage, absl::Time at, absl::Time now, absl::Duration half_life);

// The order in which teams are served: team name -> rank (0 first). Teams at their running-task
// limit get rank -1 (not served). Ties on usage / weight go to the team with fewer running tasks
// per weight, then by name. A team missing from `teams` has no usage: callers rank it 0.
std::map<std::string, int> FairShareRanks(const std::vector<TeamUsage>& teams);

// Each team's target share of the fleet (weight / Σ weights), over the teams given.
std::map<std::string, double> TargetShares(const std::vector<TeamUsage>& teams);

}  // namespace minions

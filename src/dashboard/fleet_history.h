#pragma once
// One point of the fleet's history (the dashboard's charts) and its stored form: a JSON document
// in the store's fleet_history table (MetadataStore::RecordFleetHistory), so the history outlives
// a server's restart and every server of a fleet reads the same one.
// Pure functions; thread-safe.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/fair_share.h"
#include "model/types.h"

namespace minions {

struct FleetHistoryPoint {
  absl::Time at;
  std::map<ExecutorState, int64_t> executors_by_state;
  // Tasks of the jobs that have not ended: waiting for an executor (the queue's depth) and running.
  int64_t tasks_pending = 0;
  int64_t tasks_running = 0;
  struct JobRate {
    std::string team;
    double records_per_second = 0;
  };
  std::map<std::string, JobRate> jobs;  // job id -> its rate, for the jobs running since the last point
  std::vector<TeamUsage> teams;         // team, weight and usage only are kept
  // Each executor's state, its lifetime records (records/s between two points is their
  // difference) and how many tasks it runs: its page's history. Revoked executors are left out.
  struct ExecutorSample {
    ExecutorState state = ExecutorState::kAvailable;
    int64_t records_done = 0;
    int64_t tasks_running = 0;
  };
  std::map<std::string, ExecutorSample> executors;  // executor id -> its sample
  // The tokens each team's answers used in the step that ended at `at`, summed over every
  // server (the store's fleet_tokens, not the point's document); `tokens_known` is false for the
  // newest point (mid-step: its step's tokens are not all counted yet).
  bool tokens_known = false;
  std::map<std::string, TokenUsage> tokens;
};

// The stored form of `point` (its time is the row's, not in the document).
std::string FleetHistoryPointJson(const FleetHistoryPoint& point);
// The point stored as `json` at `at`; InvalidArgument when the document is not one.
absl::StatusOr<FleetHistoryPoint> ParseFleetHistoryPoint(absl::Time at, std::string_view json);

// The step `t` falls in: the latest multiple of `step` since the Unix epoch at or before `t`.
// Servers of a fleet key their points by it, so each step is recorded once.
absl::Time HistoryStepOf(absl::Time t, absl::Duration step);

}  // namespace minions

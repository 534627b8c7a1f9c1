#include "dashboard/fleet_history.h"

#include "common/json_util.h"

namespace minions {

std::string FleetHistoryPointJson(const FleetHistoryPoint& p) {
  Json executors = Json::object();
  for (const auto& [state, n] : p.executors_by_state) executors[std::string(ExecutorStateName(state))] = n;
  Json jobs = Json::object();
  for (const auto& [id, rate] : p.jobs) jobs[id] = {{"team", rate.team}, {"records_per_second", rate.records_per_second}};
  Json teams = Json::array();
  for (const TeamUsage& t : p.teams) {
    teams.push_back({{"team", t.team}, {"weight", t.weight}, {"usage_seconds", absl::ToDoubleSeconds(t.usage)}});
  }
  // Compact ([state, records, tasks] per executor): a fleet of thousands keeps a point per step.
  Json each = Json::object();
  for (const auto& [id, e] : p.executors) {
    each[id] = Json::array({std::string(ExecutorStateName(e.state)), e.records_done, e.tasks_running});
  }
  return DumpJson(Json{{"executors", std::move(executors)},
                       {"each_executor", std::move(each)},
                       {"tasks_pending", p.tasks_pending},
                       {"tasks_running", p.tasks_running},
                       {"jobs", std::move(jobs)},
                       {"teams", std::move(teams)}});
}

absl::StatusOr<FleetHistoryPoint> ParseFleetHistoryPoint(absl::Time at, std::string_view text) {
  absl::StatusOr<Json> json = ParseJson(text);
  if (!json.ok()) return json.status();
  if (!json->is_object()) return absl::InvalidArgumentError("a history point is a JSON object");
  FleetHistoryPoint p;
  p.at = at;
  const Json& executors = JsonField(*json, "executors");
  if (executors.is_object()) {
    for (const auto& [name, n] : executors.items()) {
      // A state this release does not know (written by a newer server) is left out of the chart.
      if (auto state = ParseExecutorState(name); state && n.is_number_integer()) p.executors_by_state[*state] = n.get<int64_t>();
    }
  }
  const Json& each = JsonField(*json, "each_executor");  // absent in points of earlier releases
  if (each.is_object()) {
    for (const auto& [id, e] : each.items()) {
      if (!e.is_array() || e.size() != 3 || !e[0].is_string() || !e[1].is_number_integer() || !e[2].is_number_integer()) {
        continue;
      }
      auto state = ParseExecutorState(e[0].get<std::string>());
      if (state) p.executors[id] = {*state, e[1].get<int64_t>(), e[2].get<int64_t>()};
    }
  }
  p.tasks_pending = JsonInt(*json, "tasks_pending");
  p.tasks_running = JsonInt(*json, "tasks_running");
  const Json& jobs = JsonField(*json, "jobs");
  if (jobs.is_object()) {
    for (const auto& [id, rate] : jobs.items()) {
      p.jobs[id] = {JsonString(rate, "team"), JsonDouble(rate, "records_per_second")};
    }
  }
  const Json& teams = JsonField(*json, "teams");
  if (teams.is_array()) {
    for (const Json& t : teams) {
      TeamUsage usage;
      usage.team = JsonString(t, "team");
      usage.weight = JsonInt(t, "weight", 1);
      usage.usage = absl::Seconds(JsonDouble(t, "usage_seconds"));
      p.teams.push_back(std::move(usage));
    }
  }
  return p;
}

absl::Time HistoryStepOf(absl::Time t, absl::Duration step) {
  const int64_t step_us = std::max<int64_t>(1, absl::ToInt64Microseconds(step));
  int64_t us = absl::ToUnixMicros(t);
  int64_t floor = us / step_us * step_us;
  if (floor > us) floor -= step_us;  // before the epoch: round down, not toward zero
  return absl::FromUnixMicros(floor);
}

}  // namespace minions

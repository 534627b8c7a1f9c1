#include "dashboard/fleet_view.h"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <optional>
#include <string_view>

#include "common/logging.h"
#include "common/status_macros.h"

namespace minions {
namespace {

// A gauge family `name` with a sample for every one of `states`, its count in `counts` (0 when
// absent: a state that empties shows 0 rather than vanishing), labelled state=`name_of(state)`.
template <typename State>
metrics::FamilySnapshot ByState(const char* name, const char* help, std::initializer_list<State> states,
                                const std::map<State, int64_t>& counts, std::string_view (*name_of)(State)) {
  metrics::FamilySnapshot family{name, help, metrics::MetricType::kGauge, {}};
  for (State state : states) {
    auto it = counts.find(state);
    family.samples.push_back({name, {{"state", std::string(name_of(state))}},
                              static_cast<double>(it == counts.end() ? 0 : it->second)});
  }
  return family;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const FleetSnapshot>> FleetView::Get() {
  absl::MutexLock lock(&mu_);
  absl::Time now = clock_->Now();
  if (cached_ && !cached_by_history_ && now - cached_->taken_at < max_age_) return cached_;
  RETURN_IF_ERROR(Refresh());
  cached_by_history_ = false;
  return cached_;
}

absl::Status FleetView::RecordHistory() {
  absl::MutexLock lock(&mu_);
  // This step is recorded already (by a refresh within it); otherwise read afresh: a snapshot
  // cached from the step before would leave this one without a point.
  if (HistoryStepOf(clock_->Now(), history_step_) == last_step_recorded_) return absl::OkStatus();
  // A request reads afresh after this: the history thread's read (taken at the step, maybe
  // before a caller's own writes) must not answer for max_age what a request would read now.
  cached_by_history_ = true;
  return Refresh();
}

absl::Status FleetView::Refresh() {
  auto fresh = Read();
  if (!fresh.ok()) return fresh.status();
  cached_ = *fresh;
  FleetHistoryPoint point = PointOf(*cached_);
  for (const auto& [id, rate] : point.jobs) jobs_since_point_[id] = rate;
  const absl::Time step = HistoryStepOf(cached_->taken_at, history_step_);
  if (step <= last_step_recorded_) return absl::OkStatus();
  for (const auto& [id, rate] : jobs_since_point_) point.jobs.try_emplace(id, rate);
  point.at = step;
  // Another server may have recorded this step first: its point stands (the store keeps one).
  absl::Status recorded = store_->RecordFleetHistory({step, FleetHistoryPointJson(point)}, step - kHistorySpan);
  if (!recorded.ok()) {
    // The snapshot is good; the chart misses this step's point (a gap), which the log says.
    MINIONS_LOG(Warning) << "dashboard history: cannot record the point of " << absl::FormatTime(step) << ": "
                         << recorded.message();
    return absl::OkStatus();
  }
  jobs_since_point_.clear();
  last_step_recorded_ = step;
  return absl::OkStatus();
}

FleetHistoryPoint FleetView::PointOf(const FleetSnapshot& s) {
  FleetHistoryPoint point;
  point.at = s.taken_at;
  point.executors_by_state = s.executors_by_state;
  if (auto it = s.tasks_by_state.find(TaskState::kPending); it != s.tasks_by_state.end()) point.tasks_pending = it->second;
  if (auto it = s.tasks_by_state.find(TaskState::kRunning); it != s.tasks_by_state.end()) point.tasks_running = it->second;
  for (const Job& job : s.jobs) {
    if (IsTerminal(job.state)) continue;
    auto it = s.progress.find(job.id);
    point.jobs[job.id] = {job.spec.team, it == s.progress.end() ? 0.0 : it->second.records_per_second};
  }
  point.teams = s.teams;
  for (const Executor& e : s.executors) {
    if (e.state == ExecutorState::kRevoked) continue;
    auto running = s.running_by_executor.find(e.id);
    point.executors[e.id] = {e.state, e.records_done,
                             running == s.running_by_executor.end() ? 0 : static_cast<int64_t>(running->second.size())};
  }
  return point;
}

absl::StatusOr<std::vector<FleetHistoryPoint>> FleetView::History() {
  // The newest refresh as a point, taken under the lock; the store is read without it.
  std::optional<FleetHistoryPoint> newest;
  {
    absl::MutexLock lock(&mu_);
    if (cached_) {
      newest = PointOf(*cached_);
      for (const auto& [id, rate] : jobs_since_point_) newest->jobs.try_emplace(id, rate);
    }
  }
  const absl::Time now = newest ? std::max(newest->at, clock_->Now()) : clock_->Now();
  auto rows = store_->ListFleetHistory(now - kHistorySpan);
  if (!rows.ok()) return rows.status();
  std::vector<FleetHistoryPoint> points;
  points.reserve(rows->size() + 1);
  for (const FleetHistoryRow& row : *rows) {
    auto point = ParseFleetHistoryPoint(row.at, row.point);
    if (!point.ok()) {
      // Shown as a gap in the charts; the log says which point and why.
      MINIONS_LOG(Warning) << "dashboard history: the point of " << absl::FormatTime(row.at)
                           << " cannot be read: " << point.status().message();
      continue;
    }
    points.push_back(std::move(*point));
  }
  // Each stored point's tokens: those added at its step by every server (none added: none used).
  auto tokens = store_->ListFleetTokens(now - kHistorySpan);
  if (!tokens.ok()) return tokens.status();
  auto row = tokens->begin();
  for (FleetHistoryPoint& p : points) {
    while (row != tokens->end() && row->at < p.at) ++row;
    for (; row != tokens->end() && row->at == p.at; ++row) p.tokens[row->team] = row->tokens;
    p.tokens_known = true;
  }
  if (newest && (points.empty() || points.back().at < newest->at)) points.push_back(std::move(*newest));
  return points;
}

absl::Status FleetView::RecordTokens(const std::map<std::string, TokenUsage>& admitted_so_far, bool stopping) {
  absl::MutexLock lock(&tokens_mu_);
  std::map<std::string, TokenUsage> added;
  for (const auto& [team, total] : admitted_so_far) {
    const TokenUsage& written = tokens_written_[team];
    TokenUsage more{total.prompt_tokens - written.prompt_tokens, total.completion_tokens - written.completion_tokens};
    if (more.prompt_tokens > 0 || more.completion_tokens > 0) added[team] = more;
  }
  if (added.empty()) return absl::OkStatus();
  // Under a step's start go the tokens of the step that ended there; a stopping server's are
  // those of the step under way, which ends at the next start.
  const absl::Time step = HistoryStepOf(clock_->Now(), history_step_) + (stopping ? history_step_ : absl::ZeroDuration());
  RETURN_IF_ERROR(store_->AddFleetTokens(step, added, step - kHistorySpan));
  tokens_written_ = admitted_so_far;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const FleetSnapshot>> FleetView::Read() {
  auto snapshot = std::make_shared<FleetSnapshot>();
  snapshot->taken_at = clock_->Now();
  // The jobs that have not ended (bounded by the work in flight), then the newest others.
  std::map<std::string, Job> by_id;
  for (JobState state : {JobState::kValidating, JobState::kQueued, JobState::kRunning, JobState::kFinalizing}) {
    auto jobs = store_->ListJobs(JobFilter{state, "", kMaxJobs});
    if (!jobs.ok()) return jobs.status();
    for (Job& job : *jobs) by_id[job.id] = std::move(job);
  }
  auto recent = store_->ListJobs(JobFilter{std::nullopt, "", kRecentJobs});
  if (!recent.ok()) return recent.status();
  for (Job& job : *recent) by_id.try_emplace(job.id, std::move(job));
  std::set<std::string> active;
  for (const auto& [id, job] : by_id) {
    if (!IsTerminal(job.state)) active.insert(id);
  }
  terminal_stale_ |= std::any_of(active_ids_.begin(), active_ids_.end(),
                                 [&](const std::string& id) { return !active.count(id); });
  active_ids_ = std::move(active);
  for (auto& [id, job] : by_id) snapshot->jobs.push_back(std::move(job));
  std::sort(snapshot->jobs.begin(), snapshot->jobs.end(), [](const Job& a, const Job& b) {
    return a.created_at != b.created_at ? a.created_at > b.created_at : a.id > b.id;
  });
  // A fleet where jobs end every second recounts every kStaleRecount, not every refresh.
  absl::Duration since = snapshot->taken_at - terminal_counted_at_;
  if ((terminal_stale_ && since >= kStaleRecount) || since >= terminal_max_age_) {
    std::map<JobState, int64_t> counts;
    for (JobState state : {JobState::kCompleted, JobState::kFailed, JobState::kCancelled, JobState::kExpired}) {
      auto jobs = store_->ListJobs(JobFilter{state, "", kMaxJobs});
      if (!jobs.ok()) return jobs.status();
      counts[state] = static_cast<int64_t>(jobs->size());
    }
    terminal_counts_ = std::move(counts);
    terminal_counted_at_ = snapshot->taken_at;
    terminal_stale_ = false;
  }
  snapshot->jobs_by_state = terminal_counts_;
  auto executors = store_->ListExecutors();
  if (!executors.ok()) return executors.status();
  snapshot->executors = std::move(*executors);
  for (const Executor& e : snapshot->executors) snapshot->executors_by_state[e.state] += 1;
  auto teams = store_->ListTeamUsage(snapshot->taken_at);
  if (!teams.ok()) return teams.status();
  snapshot->teams = std::move(*teams);
  auto models = store_->ListModels("");
  if (!models.ok()) return models.status();
  snapshot->models = std::move(*models);
  for (const Job& job : snapshot->jobs) {
    if (IsTerminal(job.state)) continue;
    snapshot->jobs_by_state[job.state] += 1;
    auto& by_state = snapshot->job_tasks[job.id];
    // Only a running job has tasks other than pending (queued) or ended (finalizing): read the
    // tasks of those alone.
    if (job.state == JobState::kRunning) {
      auto tasks = store_->ListTasks(job.id);
      if (!tasks.ok()) return tasks.status();
      for (Task& t : *tasks) {
        by_state[t.state] += 1;
        if (t.state == TaskState::kRunning) {
          snapshot->records_in_flight[job.id] += t.records_done;
          snapshot->running_by_executor[t.executor_id].push_back(std::move(t));
        }
      }
    } else if (job.state == JobState::kQueued) {
      by_state[TaskState::kPending] = job.n_tasks;
    } else if (job.state == JobState::kFinalizing) {
      by_state[TaskState::kSucceeded] = job.tasks_succeeded;
      by_state[TaskState::kFailed] = job.tasks_done - job.tasks_succeeded;
    }
    for (const auto& [state, n] : by_state) snapshot->tasks_by_state[state] += n;
  }
  // Gangs whose attempt runs (every running task of a gang job is among those read above).
  auto gangs = store_->ListGangs();
  if (!gangs.ok()) return gangs.status();
  if (!gangs->empty()) {
    std::vector<Task> running;
    for (const auto& [executor, tasks] : snapshot->running_by_executor) running.insert(running.end(), tasks.begin(), tasks.end());
    snapshot->gang_of = LivingGangsByExecutor(*gangs, running);
  }
  for (const Job& job : snapshot->jobs) {
    auto in_flight = snapshot->records_in_flight.find(job.id);
    snapshot->progress[job.id] = progress_->Observe(
        job, in_flight == snapshot->records_in_flight.end() ? 0 : in_flight->second, snapshot->taken_at);
  }
  return std::shared_ptr<const FleetSnapshot>(std::move(snapshot));
}

void FleetView::ExportMetrics(metrics::Registry* registry) {
  registry->AddCollector([this](std::vector<metrics::FamilySnapshot>* out) { Collect(out); });
}

void FleetView::Collect(std::vector<metrics::FamilySnapshot>* out) {
  using metrics::FamilySnapshot;
  using metrics::MetricType;
  auto snapshot = Get();
  out->push_back({"minions_store_up", "1 when this server could read the metadata store for this scrape.",
                  MetricType::kGauge, {{"minions_store_up", {}, snapshot.ok() ? 1.0 : 0.0}}});
  out->push_back({"minions_store_conflicts_retried_total",
                  "Times the database aborted a transaction of this server to resolve a conflict with another (a "
                  "deadlock, a serialization failure); each is retried while the store's retry window allows. The "
                  "store's lock order keeps it at 0.",
                  MetricType::kCounter,
                  {{"minions_store_conflicts_retried_total", {}, static_cast<double>(store_->ConflictsRetried())}}});
  if (!snapshot.ok()) {
    MINIONS_LOG(Warning) << "metrics: cannot read the store: " << snapshot.status().message();
    return;
  }
  const FleetSnapshot& s = **snapshot;
  // Every state gets a sample, zeros included, so a state that empties shows 0 rather than vanishing.
  out->push_back(ByState("minions_jobs", "Jobs by state (from the store; the same on every server).",
                         {JobState::kValidating, JobState::kQueued, JobState::kRunning, JobState::kFinalizing,
                          JobState::kCompleted, JobState::kFailed, JobState::kCancelled, JobState::kExpired},
                         s.jobs_by_state, JobStateName));
  out->push_back(ByState("minions_tasks", "Tasks of the jobs that have not ended, by state (from the store).",
                         {TaskState::kPending, TaskState::kRunning, TaskState::kSucceeded, TaskState::kFailed,
                          TaskState::kCancelled},
                         s.tasks_by_state, TaskStateName));
  out->push_back(ByState("minions_executors",
                         "Executors by state: available, busy, owner_active, draining, lost, quarantined (an "
                         "answer failed verification), pending (waiting for an admin's approval; from the store).",
                         {ExecutorState::kAvailable, ExecutorState::kBusy, ExecutorState::kOwnerActive,
                          ExecutorState::kDraining, ExecutorState::kLost, ExecutorState::kQuarantined,
                          ExecutorState::kPending},
                         s.executors_by_state, ExecutorStateName));
  // Per job, only jobs that have not ended: bounded by the work in flight, not by history.
  FamilySnapshot records{"minions_job_records",
                         "Records of each unfinished job: total, succeeded, failed, in_flight (done by running "
                         "attempts, not yet reported).",
                         MetricType::kGauge, {}};
  FamilySnapshot job_tasks{"minions_job_tasks", "Tasks of each unfinished job by state.", MetricType::kGauge, {}};
  FamilySnapshot rates{"minions_job_records_per_second",
                       "Records each unfinished job does per second now (over the last minute; records of running "
                       "attempts count as they are done).",
                       MetricType::kGauge, {}};
  FamilySnapshot etas{"minions_job_eta_seconds",
                      "Seconds each unfinished job needs at its current rate (absent while unknown).",
                      MetricType::kGauge, {}};
  for (const Job& job : s.jobs) {
    if (IsTerminal(job.state)) continue;
    auto labels = [&](const char* key, std::string value) {
      return std::vector<std::pair<std::string, std::string>>{
          {"job_id", job.id}, {"team", job.spec.team}, {key, std::move(value)}};
    };
    auto in_flight = s.records_in_flight.find(job.id);
    records.samples.push_back({"minions_job_records", labels("kind", "total"), static_cast<double>(job.counts.total)});
    records.samples.push_back(
        {"minions_job_records", labels("kind", "succeeded"), static_cast<double>(job.counts.completed)});
    records.samples.push_back({"minions_job_records", labels("kind", "failed"), static_cast<double>(job.counts.failed)});
    records.samples.push_back({"minions_job_records", labels("kind", "in_flight"),
                               static_cast<double>(in_flight == s.records_in_flight.end() ? 0 : in_flight->second)});
    if (auto it = s.progress.find(job.id); it != s.progress.end()) {
      const std::vector<std::pair<std::string, std::string>> job_labels = {{"job_id", job.id}, {"team", job.spec.team}};
      rates.samples.push_back({"minions_job_records_per_second", job_labels, it->second.records_per_second});
      if (it->second.eta_seconds >= 0) etas.samples.push_back({"minions_job_eta_seconds", job_labels, it->second.eta_seconds});
    }
    if (auto it = s.job_tasks.find(job.id); it != s.job_tasks.end()) {
      for (const auto& [state, n] : it->second) {
        job_tasks.samples.push_back(
            {"minions_job_tasks", labels("state", std::string(TaskStateName(state))), static_cast<double>(n)});
      }
    }
  }
  FamilySnapshot team_usage{"minions_team_usage_device_seconds",
                            "Each team's fair-share usage: device time decayed with the half-life, running attempts "
                            "included (from the store).",
                            MetricType::kGauge, {}};
  FamilySnapshot team_device{"minions_team_device_seconds_total",
                             "Each team's device time: every ended attempt's, never decayed, for accounting "
                             "(from the store).",
                             MetricType::kCounter, {}};
  FamilySnapshot team_running{"minions_team_running_tasks", "Each team's running tasks (from the store).",
                              MetricType::kGauge, {}};
  FamilySnapshot team_weight{"minions_team_weight", "Each team's fair-share weight.", MetricType::kGauge, {}};
  FamilySnapshot team_share{"minions_team_target_share",
                            "Each team's target share of the fleet: its weight over the sum of all teams' weights.",
                            MetricType::kGauge, {}};
  const std::map<std::string, double> targets = TargetShares(s.teams);
  for (const TeamUsage& t : s.teams) {
    const std::vector<std::pair<std::string, std::string>> team_labels = {{"team", t.team}};
    team_usage.samples.push_back(
        {"minions_team_usage_device_seconds", team_labels, absl::ToDoubleSeconds(t.usage)});
    team_device.samples.push_back(
        {"minions_team_device_seconds_total", team_labels, absl::ToDoubleSeconds(t.device_time)});
    team_running.samples.push_back({"minions_team_running_tasks", team_labels, static_cast<double>(t.running)});
    team_weight.samples.push_back({"minions_team_weight", team_labels, static_cast<double>(t.weight)});
    team_share.samples.push_back({"minions_team_target_share", team_labels, targets.at(t.team)});
  }
  out->push_back(std::move(team_usage));
  out->push_back(std::move(team_device));
  out->push_back(std::move(team_running));
  out->push_back(std::move(team_weight));
  out->push_back(std::move(team_share));
  out->push_back(std::move(records));
  out->push_back(std::move(job_tasks));
  out->push_back(std::move(rates));
  out->push_back(std::move(etas));
}

}  // namespace minions

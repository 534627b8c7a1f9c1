#include "server/server_metrics.h"

namespace minions {
namespace {

// Bounds on what is remembered: leases whose completion never reaches this server (expired,
// completed through another server) and finished jobs are forgotten in bulk past these sizes.
constexpr size_t kMaxGrants = 200000;
constexpr size_t kMaxCached = 10000;

}  // namespace

ServerMetrics::ServerMetrics(metrics::Registry* registry, MetadataStore* store) : store_(store) {
  leases_granted_ = registry->AddCounter("minions_leases_granted_total", "Task leases granted by this server.");
  attempts_ = registry->AddCounterFamily(
      "minions_task_attempts_total",
      "Task attempts reported to this server, by outcome: succeeded, retried (back to pending after a "
      "retryable failure), preempted (owner came back; not counted against the task), failed (for good).",
      {"outcome"});
  records_succeeded_ = registry->AddCounterFamily(
      "minions_records_succeeded_total", "Records whose output line was written, by the job's team.", {"team"});
  records_failed_ = registry->AddCounterFamily(
      "minions_records_failed_total",
      "Records that ended as error lines, and every record of a task an executor reported failed for good "
      "(a task failed by lease expiry is counted in minions_watchdog_actions_total{action=\"fail_task\"}), by team.",
      {"team"});
  harvested_seconds_ = registry->AddCounterFamily(
      "minions_harvested_device_seconds_total",
      "Executor time spent on a team's tasks (every attempt, from its lease grant or the end of the executor's attempt "
      "before, whichever is later, to its report: a task queued on an executor counts from when it could run), by "
      "the executor's device "
      "(gpu or cpu) and its kind (the accelerator it reports: metal, cuda, vulkan, cpu). GPU-hours: sum by (team) "
      "(increase(...{device=\"gpu\"}[1h])) / 3600; per kind: sum by (team, kind).",
      {"team", "device", "kind"});
  tokens_ = registry->AddCounterFamily(
      "minions_tokens_total",
      "Tokens the answers of a team's jobs state they used (their response.body.usage), by kind (prompt, "
      "completion), counted as this server admits each checkpoint of output (once per chunk it reads; the "
      "executors' word): tokens per second is sum by (team) (rate(...[1m])).",
      {"team", "kind"});
  for (const char* outcome : {"succeeded", "retried", "preempted", "failed"}) attempts_->With({outcome});
  task_duration_ = registry->AddHistogram(
      "minions_task_duration_seconds", "Lease grant to completion of the attempts that succeeded.",
      metrics::ExponentialBuckets(0.05, 2, 16));  // 50 ms .. ~27 min
  queue_wait_ = registry->AddHistogram(
      "minions_task_queue_wait_seconds", "Job submission to the first lease of each of its tasks.",
      metrics::ExponentialBuckets(0.05, 2, 18));  // 50 ms .. ~1.8 h
  heartbeat_time_ = registry->AddHistogram(
      "minions_heartbeat_seconds",
      "A heartbeat's time in this server, from its handler's start to its answer: its wait for a batch and the "
      "batch's write to the store (what the server adds to an executor's heartbeat latency, gRPC's queues aside).",
      metrics::ExponentialBuckets(0.001, 2, 13));  // 1 ms .. ~4 s
}

void ServerMetrics::HeartbeatAnswered(absl::Duration took) { heartbeat_time_->Observe(absl::ToDoubleSeconds(took)); }

std::map<std::string, TokenUsage> ServerMetrics::TokensAdmittedSoFar() {
  absl::MutexLock lock(&mu_);
  return tokens_admitted_;
}

void ServerMetrics::TokensAdmitted(const std::string& team, const TokenUsage& tokens) {
  if (tokens.prompt_tokens > 0 || tokens.completion_tokens > 0) {
    absl::MutexLock lock(&mu_);
    tokens_admitted_[team].Add(tokens);
  }
  if (tokens.prompt_tokens > 0) tokens_->With({team, "prompt"})->Increment(static_cast<double>(tokens.prompt_tokens));
  if (tokens.completion_tokens > 0) {
    tokens_->With({team, "completion"})->Increment(static_cast<double>(tokens.completion_tokens));
  }
}

ServerMetrics::JobInfo ServerMetrics::JobInfoOf(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = jobs_.find(job_id); it != jobs_.end()) return it->second;
  }
  // A job's team and submission time never change, so one read per job is enough.
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return {"unknown", absl::InfinitePast()};
  JobInfo info{job->spec.team, job->created_at};
  absl::MutexLock lock(&mu_);
  RememberJob(job_id, info);
  return info;
}

void ServerMetrics::RememberJob(const std::string& job_id, const JobInfo& info) {
  if (jobs_.size() >= kMaxCached) jobs_.clear();
  jobs_[job_id] = info;
}

void ServerMetrics::JobSubmitted(const Job& job) {
  records_succeeded_->With({job.spec.team});
  records_failed_->With({job.spec.team});
  tokens_->With({job.spec.team, "prompt"});
  tokens_->With({job.spec.team, "completion"});
  absl::MutexLock lock(&mu_);
  RememberJob(job.id, {job.spec.team, job.created_at});
}

ServerMetrics::Device ServerMetrics::DeviceOf(const std::string& executor_id) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = devices_.find(executor_id); it != devices_.end()) return it->second;
  }
  auto executor = store_->GetExecutor(executor_id);
  if (!executor.ok()) return {"cpu", kAcceleratorCpu};
  // gpu for any accelerator the executor reported (Metal, CUDA), cpu otherwise; the kind as reported.
  const std::string& kind = executor->info.accelerator;
  Device device;
  device.device = (!kind.empty() && kind != kAcceleratorCpu) || !executor->info.gpu.empty() ? "gpu" : "cpu";
  device.kind = kind.empty() ? std::string(kAcceleratorCpu) : kind;
  absl::MutexLock lock(&mu_);
  if (devices_.size() >= kMaxCached) devices_.clear();
  devices_[executor_id] = device;
  return device;
}

void ServerMetrics::LeaseGranted(const Task& task, absl::Time now) {
  leases_granted_->Increment();
  JobInfo job = JobInfoOf(task.job_id);
  // Only first attempts: a retried task's wait would mix in its backoff.
  if (task.attempt == 1 && job.created_at != absl::InfinitePast()) {
    queue_wait_->Observe(absl::ToDoubleSeconds(now - job.created_at));
  }
  absl::MutexLock lock(&mu_);
  if (grants_.size() >= kMaxGrants) {
    for (auto it = grants_.begin(); it != grants_.end();) {
      it = now - it->second.at > absl::Hours(24) ? grants_.erase(it) : std::next(it);
    }
    if (grants_.size() >= kMaxGrants) grants_.clear();
  }
  grants_[{task.job_id, task.index, task.attempt}] = {now, job.team};
}

std::optional<ServerMetrics::Granted> ServerMetrics::TakeGrant(const AttemptKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = grants_.find(key);
  if (it == grants_.end()) return std::nullopt;
  Granted g = it->second;
  grants_.erase(it);
  return g;
}

void ServerMetrics::ObserveAttemptTime(const std::string& executor_id, const std::optional<Granted>& grant,
                                       absl::Time now, bool completed) {
  // Attempts leased through another server (or before a restart) have no known start.
  if (!grant) return;
  absl::Time from = grant->at;
  {
    absl::MutexLock lock(&mu_);
    if (charged_until_.size() >= kMaxCached) charged_until_.clear();
    auto [last, added] = charged_until_.try_emplace(executor_id, now);
    if (!added) {
      from = std::max(from, last->second);
      last->second = std::max(last->second, now);
    }
  }
  double seconds = std::max(0.0, absl::ToDoubleSeconds(now - from));
  const Device device = DeviceOf(executor_id);
  harvested_seconds_->With({grant->team, device.device, device.kind})->Increment(seconds);
  if (completed) task_duration_->Observe(seconds);
}

void ServerMetrics::AttemptCompleted(const std::string& executor_id, const LeaseProgress& report, absl::Time now) {
  std::string team = JobInfoOf(report.job_id).team;
  attempts_->With({"succeeded"})->Increment();
  records_succeeded_->With({team})->Increment(static_cast<double>(report.records_done - report.records_failed));
  records_failed_->With({team})->Increment(static_cast<double>(report.records_failed));
  ObserveAttemptTime(executor_id, TakeGrant({report.job_id, report.task_index, report.attempt}), now, true);
}

void ServerMetrics::AttemptFailed(const std::string& executor_id, const Task& after, FailureClass failure,
                                  absl::Time now) {
  std::string outcome = after.state == TaskState::kFailed   ? "failed"
                        : failure == FailureClass::kPreempted ? "preempted"
                                                              : "retried";
  attempts_->With({outcome})->Increment();
  std::string team = JobInfoOf(after.job_id).team;
  if (after.state == TaskState::kFailed) records_failed_->With({team})->Increment(static_cast<double>(after.n_records));
  ObserveAttemptTime(executor_id, TakeGrant({after.job_id, after.index, after.attempt}), now, false);
}

}  // namespace minions

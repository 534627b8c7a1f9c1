#include "model/types.h"

#include "absl/strings/str_cat.h"

namespace minions {
namespace {

template <typename E, size_t N>
std::optional<E> Lookup(const std::string_view (&names)[N], std::string_view name) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<E>(i);
  }
  return std::nullopt;
}

constexpr std::string_view kJobStates[] = {"validating", "queued",    "running",   "finalizing",
                                           "completed",  "failed",    "cancelled", "expired"};
constexpr std::string_view kTaskStates[] = {"pending", "running", "succeeded", "failed", "cancelled"};
constexpr std::string_view kExecutorStates[] = {"available", "busy", "owner_active", "draining", "lost", "revoked",
                                                "quarantined", "pending"};
constexpr std::string_view kFailureClasses[] = {"retryable", "permanent", "preempted"};

}  // namespace

std::string_view JobStateName(JobState s) { return kJobStates[static_cast<int>(s)]; }
std::string_view TaskStateName(TaskState s) { return kTaskStates[static_cast<int>(s)]; }
std::string_view ExecutorStateName(ExecutorState s) { return kExecutorStates[static_cast<int>(s)]; }
std::string_view ExecutorStateShown(ExecutorState s) {
  return s == ExecutorState::kOwnerActive ? "unavailable" : ExecutorStateName(s);
}
std::string_view FailureClassName(FailureClass f) { return kFailureClasses[static_cast<int>(f)]; }
std::optional<JobState> ParseJobState(std::string_view n) { return Lookup<JobState>(kJobStates, n); }
std::optional<TaskState> ParseTaskState(std::string_view n) { return Lookup<TaskState>(kTaskStates, n); }
std::optional<ExecutorState> ParseExecutorState(std::string_view n) {
  return Lookup<ExecutorState>(kExecutorStates, n);
}
std::optional<FailureClass> ParseFailureClass(std::string_view n) {
  return Lookup<FailureClass>(kFailureClasses, n);
}

bool IsTerminal(JobState s) {
  return s == JobState::kCompleted || s == JobState::kFailed || s == JobState::kCancelled ||
         s == JobState::kExpired;
}
bool IsTerminal(TaskState s) {
  return s == TaskState::kSucceeded || s == TaskState::kFailed || s == TaskState::kCancelled;
}

std::string Describe(const AttemptRef& ref) {
  return absl::StrCat("job=", ref.job_id, " task=", ref.task_index, " attempt=", ref.attempt);
}

int64_t CommittedFailed(const Task& task) {
  int64_t failed = 0;
  for (const Chunk& c : task.chunks) failed += c.records_failed;
  return failed;
}

Lease MakeLease(Task task, const JobSpec& spec) {
  Lease lease;
  lease.expires_at = task.lease_expires_at.value_or(absl::InfinitePast());
  lease.task = std::move(task);
  lease.job_model = spec.model;
  lease.team = spec.team;
  lease.runner = spec.requirements.runner;
  lease.model_digest = spec.model_digest;
  lease.model_size_bytes = spec.model_size_bytes;
  lease.runner_options = spec.runner_options;
  lease.input_key = spec.input_key;
  return lease;
}

}  // namespace minions

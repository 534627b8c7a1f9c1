#include "model/task_sizing.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace minions {

ThroughputKey ThroughputKeyOf(const JobSpec& spec) {
  return ThroughputKey{spec.model_digest.empty() ? spec.model : spec.model_digest, spec.requirements.runner};
}

std::optional<ThroughputSample> SampleOfCompletion(const Task& task, int attempt) {
  if (task.state != TaskState::kSucceeded || task.attempt != attempt) return std::nullopt;
  if (!task.started_at || !task.finished_at) return std::nullopt;
  // Records resumed from earlier attempts' checkpoints were not this attempt's work.
  int64_t resumed = 0;
  for (const Chunk& chunk : task.chunks) {
    if (chunk.attempt < attempt && chunk.begin == resumed) resumed = chunk.end;
  }
  ThroughputSample sample{task.n_records - resumed, *task.finished_at - *task.started_at};
  if (sample.records <= 0 || sample.took <= absl::ZeroDuration()) return std::nullopt;
  return sample;
}

TaskSize SizeTasks(const std::optional<Throughput>& measured, const TaskSizing& sizing) {
  const int64_t low = std::max<int64_t>(1, sizing.min_records);
  const int64_t high = std::max(low, sizing.max_records);
  if (!measured || measured->RecordsPerSecond() <= 0) {
    return TaskSize{std::clamp(sizing.default_records, low, high),
                    "no finished task of this model and runner measured yet: the default size"};
  }
  const double rate = measured->RecordsPerSecond();
  const double wanted = rate * absl::ToDoubleSeconds(sizing.target);
  // Clamp in floating point first: a huge rate must not overflow the conversion.
  const double bounded = std::clamp(std::round(wanted), static_cast<double>(low), static_cast<double>(high));
  std::string why = absl::StrFormat("measured %.3g records/s over %d finished tasks: %.0f records make a %s task",
                                    rate, measured->samples, wanted, absl::FormatDuration(sizing.target));
  if (bounded != std::round(wanted)) absl::StrAppendFormat(&why, " (bounded to [%d, %d])", low, high);
  return TaskSize{static_cast<int64_t>(bounded), std::move(why)};
}

}  // namespace minions

#include "model/task_sizing.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace minions {

ThroughputKey ThroughputKeyOf(const JobSpec& spec) {
  // The answers' length is part of the key's runner (the store keeps (model, runner) rows): a
  // record asking for 64 tokens takes about eight times what one asking for 8 does.
  const int64_t bucket = AnswerTokensBucket(spec.tokens_per_record);
  std::string runner = spec.requirements.runner;
  if (bucket > 0) absl::StrAppend(&runner, "#answers<=", bucket);
  return ThroughputKey{spec.model_digest.empty() ? spec.model : spec.model_digest, std::move(runner)};
}

int64_t AnswerTokensBucket(int64_t tokens_per_record) {
  if (tokens_per_record <= 0) return 0;
  int64_t bucket = 16;
  while (bucket < tokens_per_record && bucket < (int64_t{1} << 40)) bucket *= 2;
  return bucket;
}

int64_t SpreadOverFreeExecutors(int64_t records, int64_t shard, int free_executors, int64_t min_records,
                                std::string* why) {
  if (records <= 0 || shard <= 0 || free_executors <= 1) return shard;
  const int64_t tasks = (records + shard - 1) / shard;
  if (tasks >= free_executors) return shard;
  const int64_t spread = std::max<int64_t>({1, min_records, (records + free_executors - 1) / free_executors});
  if (spread >= shard) return shard;
  if (why != nullptr) {
    absl::StrAppendFormat(why, "; %d records spread over the %d free executors: tasks of %d (not %d)", records,
                          free_executors, spread, shard);
  }
  return spread;
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

#pragma once
// Throughput-aware task sizes: how many records a new job's tasks get so that one task runs about
// a target time on the executors that run it, from what finished tasks of the same model and
// runner measured (records per second, kept in the store: MetadataStore::RecordThroughput).
//
// A throughput is two decayed sums, records and seconds, over finished attempts: each new sample
// is added after the old sums are multiplied by kThroughputMemory, so the last few tasks count
// most and one odd task moves the estimate only part of the way. Its rate is records / seconds
// (a ratio of sums, not a mean of rates: a fast short task does not outweigh a long slow one).
// An attempt's sample is the records it processed itself (not those resumed from an earlier
// attempt's checkpoints) over its run time, model loading included: what a task of the job will
// cost the next executor too.
//
// Pure functions; any thread.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "model/types.h"

namespace minions {

// What the store keeps per (model, runner).
struct Throughput {
  double records = 0;   // decayed sum of records processed
  double seconds = 0;   // decayed sum of the attempts' run times
  int64_t samples = 0;  // finished attempts measured (not decayed)
  absl::Time updated_at;
  double RecordsPerSecond() const { return seconds > 0 ? records / seconds : 0; }
  bool operator==(const Throughput&) const = default;
};

// Weight of the old sums when a new sample is added.
inline constexpr double kThroughputMemory = 0.8;

// The key throughput is kept under: a registry model by digest (the bytes, whatever the team
// calls it), a model named by path by that path; and the runner that serves it.
struct ThroughputKey {
  std::string model;
  std::string runner;
  bool operator==(const ThroughputKey&) const = default;
};
ThroughputKey ThroughputKeyOf(const JobSpec& spec);

// What one finished attempt measured.
struct ThroughputSample {
  int64_t records = 0;
  absl::Duration took;
};
// The sample of `task` just completed by `attempt` (its state and times as the store left them),
// or nullopt when it measured nothing usable: another attempt's completion (a straggler's
// shadow won, so started_at is not its own), no records of its own, or no run time.
std::optional<ThroughputSample> SampleOfCompletion(const Task& task, int attempt);

// How a server sizes tasks (ServerOptions).
struct TaskSizing {
  absl::Duration target = absl::Minutes(1);  // the run time a task should have
  int64_t default_records = 100;             // a model/runner with no history
  int64_t min_records = 1;                   // bounds on a measured size
  int64_t max_records = 10000;
};

struct TaskSize {
  int64_t records = 0;
  std::string why;  // for the log and the job's owner: "measured 2.5 records/s ..." or "no history"
};

// The records per task of a new job whose (model, runner) measured `measured` (nullopt: none).
TaskSize SizeTasks(const std::optional<Throughput>& measured, const TaskSizing& sizing);

// The power of two at or above `tokens_per_record` (JobSpec::tokens_per_record; at least 16), or
// 0 when it is not known: jobs whose answers are about as long share one measurement.
int64_t AnswerTokensBucket(int64_t tokens_per_record);

// Small jobs spread: while `free_executors` could each take a task, a job of `records` records
// gets at least that many tasks (tasks of at least `min_records`), so it ends in the time of its
// share rather than on one executor. Returns the shard size to use (never more than `shard`), and
// says why in `why` when it changed it.
int64_t SpreadOverFreeExecutors(int64_t records, int64_t shard, int free_executors, int64_t min_records,
                                std::string* why);

}  // namespace minions

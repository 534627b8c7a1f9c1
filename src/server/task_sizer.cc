#include "server/task_sizer.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace minions {

void MeasureCompletion(MetadataStore& store, const Job& job, int64_t task_index, int attempt, absl::Time now) {
  absl::StatusOr<Task> task = store.GetTask(job.id, task_index);
  if (!task.ok()) {
    MINIONS_LOG(Warning) << "job=" << job.id << " task=" << task_index << " not measured: " << task.status();
    return;
  }
  std::optional<ThroughputSample> sample = SampleOfCompletion(*task, attempt);
  if (!sample) return;
  if (absl::Status recorded = store.RecordThroughput(ThroughputKeyOf(job.spec), *sample, now); !recorded.ok()) {
    MINIONS_LOG(Warning) << "job=" << job.id << " task=" << task_index << " not measured: " << recorded;
  }
}

bool CompletionSampler::Take(const ThroughputKey& key, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Window& window = windows_[absl::StrCat(key.model, "\n", key.runner)];
  if (window.taken == 0 || now - window.start >= absl::Seconds(1) || now < window.start) {
    window = Window{now, 0};
  }
  if (window.taken >= per_second_) return false;
  ++window.taken;
  return true;
}

absl::StatusOr<TaskSize> SizeTasksFor(MetadataStore& store, const JobSpec& spec, const TaskSizing& sizing) {
  ASSIGN_OR_RETURN(std::optional<Throughput> measured, store.GetThroughput(ThroughputKeyOf(spec)));
  return SizeTasks(measured, sizing);
}

}  // namespace minions

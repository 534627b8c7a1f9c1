#include "server/task_sizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "runner/batch_record.h"
#include "runner/protocol.h"

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

absl::StatusOr<int64_t> EstimateTokensPerRecord(BlobStore& blobs, const std::string& input_key,
                                                const Json& runner_options) {
  constexpr int64_t kHead = int64_t{1} << 20;
  constexpr int kMaxRecords = 1000;
  ASSIGN_OR_RETURN(std::string head, blobs.GetRange(input_key, 0, kHead));
  // A head cut short ends in part of a line: not a record to read.
  if (static_cast<int64_t>(head.size()) == kHead) head.resize(head.rfind('\n') == std::string::npos ? 0 : head.rfind('\n'));
  int chat_default = runner_protocol::LoadOptions{}.default_max_tokens;
  if (auto options = runner_protocol::LoadOptions::FromJson(runner_options); options.ok()) {
    chat_default = options->default_max_tokens;
  }
  int64_t records = 0, tokens = 0;
  for (const std::string& line : SplitRecordLines(head)) {
    if (records == kMaxRecords) break;
    ParsedRecord parsed = ParseRecordLine(line);
    if (!parsed.ok()) continue;
    const InferenceRequest& r = *parsed.request;
    ++records;
    tokens += r.endpoint == Endpoint::kEmbeddings ? 1
              : r.sampling.max_tokens             ? std::max(1, *r.sampling.max_tokens)
              : r.endpoint == Endpoint::kCompletions ? 16
                                                      : chat_default;
  }
  return records == 0 ? 0 : (tokens + records - 1) / records;
}

absl::StatusOr<TaskSize> SizeTasksFor(MetadataStore& store, const JobSpec& spec, const TaskSizing& sizing) {
  ASSIGN_OR_RETURN(std::optional<Throughput> measured, store.GetThroughput(ThroughputKeyOf(spec)));
  return SizeTasks(measured, sizing);
}

}  // namespace minions

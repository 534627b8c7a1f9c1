// One input line through the record parser, and a whole input through the JSONL splitter (fed in
// pieces): never a crash, error lines always printable, and the tasks always cover the input.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "runner/batch_record.h"
#include "server/job_splitter.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace minions;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  ParsedRecord record = ParseRecordLine(text);
  if (record.ok() && record.custom_id.empty()) std::abort();
  (void)DumpJson(record.ok() ? MakeResponseLine(record.custom_id, Json::object())
                             : MakeErrorLine(record.custom_id, record.error_code, record.error_message));
  const size_t piece = size > 0 ? static_cast<size_t>(data[0] % 17) + 1 : 1;
  InputSplitter splitter(/*shard_size=*/2, /*max_tasks=*/50);
  for (size_t at = 0; at < size; at += piece) splitter.Feed(text.substr(at, piece));
  auto split = splitter.Finish();
  if (split.ok()) {
    int64_t covered = 0, records = 0;
    for (const Task& task : split->tasks) {
      if (task.byte_begin != covered || task.byte_end < task.byte_begin) std::abort();
      std::string_view range = text.substr(task.byte_begin, task.byte_end - task.byte_begin);
      if (static_cast<int64_t>(SplitRecordLines(range).size()) != task.n_records) std::abort();
      covered = task.byte_end;
      records += task.n_records;
    }
    if (covered != static_cast<int64_t>(size) || records != split->total_records) std::abort();
  }
  return 0;
}

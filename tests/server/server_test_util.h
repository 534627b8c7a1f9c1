#pragma once
// Helpers shared by the server tests: status assertions, a temporary folder per test, input lines
// in the OpenAI Batch format, and a blob store that forwards to another (for tests that change one
// of its calls).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "blob/blob_store.h"
#include "server/job_splitter.h"
#include "store/metadata_store.h"
#include "testing/forwarding_blob_store.h"
#include "testing/matchers.h"
#include "testing/status_checks.h"

namespace minions::testing {

// A fresh folder, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::path(::testing::TempDir()) / "minions-srv-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One OpenAI Batch request line (no newline).
// Registers an executor named `name` straight in `store` (Linux, 8 GiB, the llama runner, at most
// `max_tasks` tasks at once) at `now`: its id, or "" with the test failed.
inline std::string RegisterInStore(MetadataStore& store, const std::string& name, int max_tasks, absl::Time now) {
  ExecutorInfo info;
  info.name = name;
  info.os = "linux";
  info.memory_bytes = int64_t{8} << 30;
  info.runners = {"llama"};
  info.max_tasks = max_tasks;
  auto executor = store.RegisterExecutor("", info, now);
  EXPECT_TRUE(executor.ok()) << executor.status();
  return executor.ok() ? executor->id : "";
}

// Until `n` calls wait at a group commit's gate (`batcher.waiting()`: server/group_commit.h), up to
// 10 s; then the test fails unless they do.
template <typename Batcher>
void AwaitWaitingAtTheGate(const Batcher& batcher, int64_t n) {
  for (int i = 0; i < 10000 && batcher.waiting() != n; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(batcher.waiting(), n);
}

inline std::string RequestLine(const std::string& custom_id, const std::string& prompt = "hello") {
  return absl::StrCat(R"({"custom_id":")", custom_id,
                      R"(","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":")",
                      prompt, R"("}]}})");
}

// A queued job of `team` (model "m") over `tasks` request lines r0, r1, ... written at `input_key`,
// one task a record, straight in `store` at `now`: its id, or "" with the test failed.
inline std::string QueueOneRecordTasks(MetadataStore& store, BlobStore& blobs, const std::string& input_key,
                                       int tasks, absl::Time now, const std::string& team = "") {
  std::string input;
  for (int i = 0; i < tasks; ++i) input += RequestLine(absl::StrCat("r", i)) + "\n";
  EXPECT_OK(blobs.Put(input_key, input));
  absl::StatusOr<SplitResult> split = SplitInput(blobs, input_key, 1);
  EXPECT_OK(split);
  JobSpec spec;
  spec.team = team;
  spec.model = "m";
  spec.input_key = input_key;
  absl::StatusOr<Job> job = store.CreateJob(spec, now);
  EXPECT_OK(job);
  if (!split.ok() || !job.ok()) return "";
  EXPECT_OK(store.AddTasks(job->id, split->tasks, tasks, now));
  return job->id;
}

// A response line for `custom_id`, as a runner would write it (no newline).
inline std::string OutputLine(const std::string& custom_id, const std::string& text) {
  return absl::StrCat(R"({"custom_id":")", custom_id, R"(","response":{"status_code":200,"body":{"text":")", text,
                      R"("}},"error":null})");
}

}  // namespace minions::testing

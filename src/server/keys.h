#pragma once
// Where things live in the object store. Task outputs are scoped by attempt: a stale attempt's
// late upload lands beside the winner's and is never read, because the manifest names the attempt
// that completed.

#include <string>

#include "absl/strings/str_cat.h"

namespace minions::keys {

inline std::string JobInput(const std::string& job) { return absl::StrCat("jobs/", job, "/input.jsonl"); }
inline std::string TaskPrefix(const std::string& job, int64_t task) {
  return absl::StrCat("jobs/", job, "/tasks/", task, "/");
}
inline std::string TaskOutput(const std::string& job, int64_t task, int attempt) {
  return absl::StrCat(TaskPrefix(job, task), "attempt-", attempt, "/output.jsonl");
}
inline std::string TaskErrors(const std::string& job, int64_t task, int attempt) {
  return absl::StrCat(TaskPrefix(job, task), "attempt-", attempt, "/errors.jsonl");
}
inline std::string JobOutput(const std::string& job) { return absl::StrCat("jobs/", job, "/results/output.jsonl"); }
inline std::string JobErrors(const std::string& job) { return absl::StrCat("jobs/", job, "/results/errors.jsonl"); }
inline std::string JobManifest(const std::string& job) { return absl::StrCat("jobs/", job, "/results/manifest.json"); }

}  // namespace minions::keys

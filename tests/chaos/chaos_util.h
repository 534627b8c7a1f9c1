// What the chaos suite's tests share: the fault-free results their runs are compared with (the
// records run by one runner in one process, `minions local-run`), and a job's state for a failure
// message. Each test runs in its own process under ctest, so a reference is kept on disk and made
// again only when the input, the binaries or the model change.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pool_test_util.h"

namespace minions::testing {

struct Reference {
  std::vector<std::string> lines;
  std::vector<Json> output, errors;
};

// Changes when anything that decides the reference's contents changes: the input, and the bytes
// (not the times) of the programs and the model (the model is made again for every test run).
inline std::string ReferenceStamp(const std::vector<std::string>& lines) {
  std::string stamp = absl::StrCat(std::hash<std::string>()(absl::StrJoin(lines, "\n")));
  for (const std::string& file : {kBin + "/minions", kBin + "/minions-llama-runner", kModel}) {
    absl::StrAppend(&stamp, " ", file, ":", std::hash<std::string>()(ReadFile(file)));
  }
  return stamp;
}

// The reference of `lines`, kept in `dir` (its local.jsonl and local-errors.jsonl).
inline Reference MakeReference(std::vector<std::string> lines, const std::string& dir) {
  Reference r;
  r.lines = std::move(lines);
  const std::string stamp = ReferenceStamp(r.lines);
  // ctest -j runs the chaos variants at once, each in its own process: without a lock two of
  // them both find the stamp stale and remove the folder while the other one is filling it.
  const int lock = ::open((dir + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  EXPECT_GE(lock, 0) << "cannot open the reference's lock file " << dir << ".lock";
  if (lock >= 0) ::flock(lock, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() {
      if (fd >= 0) ::close(fd);  // Closing releases the flock.
    }
  } unlock{lock};
  if (ReadFile(dir + "/stamp") != stamp) {
    std::filesystem::remove_all(dir);
    // One thread: spinning ggml threads on a shared machine slow everyone down.
    RunLocally(WriteInput(dir, r.lines), dir, 4, 1);
    if (::testing::Test::HasFatalFailure()) return r;
    std::ofstream(dir + "/stamp") << stamp;
  }
  r.output = Lines(ReadFile(dir + "/local.jsonl"));
  r.errors = Lines(ReadFile(dir + "/local-errors.jsonl"));
  return r;
}

// Job, task and executor states, for a failure message.
inline std::string DescribeState(ProcessPool& pool, const std::string& job_id) {
  cli::JobsClient client(pool.connection());
  std::string out;
  auto job = client.Get(job_id);
  if (job.ok()) {
    absl::StrAppend(&out, "job ", job_id, ": ", job->state(), " (", job->request_counts().completed(), " completed, ",
                    job->request_counts().failed(), " failed of ", job->request_counts().total(), ") ",
                    job->error(), "\n");
  } else {
    absl::StrAppend(&out, "job ", job_id, ": ", job.status().ToString(), "\n");
  }
  auto tasks = client.Tasks(job_id);
  if (tasks.ok()) {
    std::map<std::string, int> by_state;
    for (const auto& t : *tasks) {
      ++by_state[t.state()];
      if (t.state() != "succeeded") {
        absl::StrAppend(&out, "  task ", t.index(), ": ", t.state(), " attempt ", t.attempt(), " failures ",
                        t.failures(), " executor ", t.executor_id(), " records_done ", t.records_done(), " ",
                        t.last_error(), "\n");
      }
    }
    for (const auto& [state, n] : by_state) absl::StrAppend(&out, "  ", n, " tasks ", state, "\n");
  }
  auto executors = client.Executors();
  if (executors.ok()) {
    for (const auto& e : *executors) {
      absl::StrAppend(&out, "  executor ", e.name(), " (", e.id(), "): ", e.state(), ", holds [",
                      absl::StrJoin(e.current_tasks(), " "), "]\n");
    }
  }
  return out;
}

}  // namespace minions::testing

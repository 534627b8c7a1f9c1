// minions-bench-paced-runner: a runner (docs/runner-protocol.md) that spends a fixed time on each
// record and logs every batch it starts and every record it finishes, so that the failover
// benchmark sees where a task runs and counts exactly which records ran more than once. Its Dask
// counterpart is the task body in bench/dask_failover.py: same pacing, same log.
//
// Configured through the environment (an executor's runner inherits it):
//   MINIONS_PACED_RECORD_MS   time per record (default 50)
//   MINIONS_PACED_LOG         file the log lines are appended to (default: none)
// Log lines (one write each, O_APPEND, so several runners may share the file):
//   "<unix_ms> start <batch> <pid> <parent pid>"
//   "<unix_ms> record <batch> <custom_id>"
//
// Threads: a reader thread takes commands (so a cancel or ping is answered while a batch runs);
// the main thread runs batches one at a time, in order. Output lines are written under a mutex.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runner/batch_record.h"
#include "runner/protocol.h"

namespace {

using namespace minions;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class PacedRunner {
 public:
  PacedRunner() {
    const char* ms = std::getenv("MINIONS_PACED_RECORD_MS");
    record_ms_ = ms && *ms ? std::atoi(ms) : 50;
    const char* log = std::getenv("MINIONS_PACED_LOG");
    if (log && *log) log_fd_ = ::open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }

  int Run() {
    Send(runner_protocol::EncodeReady("paced", "1"));
    std::thread reader([this] { Read(); });
    reader.detach();  // blocked in getline; the process ends with main
    while (true) {
      runner_protocol::RunRequest batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || done_; });
        if (queue_.empty()) return 0;
        batch = std::move(queue_.front());
        queue_.pop_front();
      }
      RunBatch(batch);
    }
  }

 private:
  void Read() {
    std::string line;
    while (std::getline(std::cin, line)) {
      auto command = runner_protocol::DecodeCommand(line);
      if (!command.ok()) {
        Send(runner_protocol::EncodeError("unknown", "", std::string(command.status().message())));
        continue;
      }
      switch (command->op) {
        case runner_protocol::Command::Op::kLoad:
          Send(runner_protocol::EncodeLoaded(command->load.model, Json::object()));
          break;
        case runner_protocol::Command::Op::kRun: {
          std::lock_guard<std::mutex> lock(mu_);
          queue_.push_back(std::move(command->run));
          cv_.notify_all();
          break;
        }
        case runner_protocol::Command::Op::kCancel: {
          std::lock_guard<std::mutex> lock(mu_);
          cancelled_.insert(command->id);
          break;
        }
        case runner_protocol::Command::Op::kPing:
          Send(runner_protocol::EncodePong(command->id));
          break;
        case runner_protocol::Command::Op::kShutdown:
          std::_Exit(0);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

  void RunBatch(const runner_protocol::RunRequest& batch) {
    Log(absl::StrCat(NowMs(), " start ", batch.batch, " ", getpid(), " ", getppid(), "\n"));
    runner_protocol::BatchStats stats;
    for (size_t i = 0; i < batch.records.size(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(record_ms_));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (cancelled_.count(batch.batch)) {
          stats.cancelled = true;
          break;
        }
      }
      ParsedRecord parsed = ParseRecordLine(batch.records[i]);
      Json out = parsed.ok()
                     ? MakeResponseLine(parsed.custom_id, MakeCompletionBody(parsed.custom_id, "paced", "", "stop", {}, 0))
                     : MakeErrorLine(parsed.custom_id, parsed.error_code, parsed.error_message);
      stats.errors += !parsed.ok();
      ++stats.records;
      Send(runner_protocol::EncodeResult(batch.batch, i, out));
      Log(absl::StrCat(NowMs(), " record ", batch.batch, " ", parsed.custom_id, "\n"));
    }
    Send(runner_protocol::EncodeBatchDone(batch.batch, stats));
  }

  void Send(const std::string& line) {
    std::lock_guard<std::mutex> lock(out_mu_);
    std::cout << line << std::flush;
  }

  void Log(const std::string& line) {
    if (log_fd_ >= 0) (void)!::write(log_fd_, line.data(), line.size());
  }

  int record_ms_ = 50;
  int log_fd_ = -1;
  std::mutex out_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<runner_protocol::RunRequest> queue_;  // guarded by mu_
  std::set<std::string> cancelled_;                // guarded by mu_
  bool done_ = false;                              // guarded by mu_
};

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  return PacedRunner().Run();
}

#include "server/presence.h"

#include "common/logging.h"
#include "common/thread_name.h"

namespace minions {

Presence::~Presence() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    exiting_ = true;
    thread.swap(thread_);
  }
  if (thread.joinable()) thread.join();
}

void Presence::Attached(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  ++attached_[executor_id];
  if (!thread_.joinable() && !exiting_) {
    thread_ = std::thread([this] {
      NameThisThread("presence");
      Loop();
    });
  }
}

void Presence::Detached(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  auto it = attached_.find(executor_id);
  if (it == attached_.end()) return;
  if (--it->second > 0) return;  // it holds another stream here (a reconnect)
  attached_.erase(it);
  // The server's own shutdown ends every stream: that is not the executor going.
  if (!stopping_) detached_.push_back(executor_id);
}

void Presence::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void Presence::Loop() {
  while (true) {
    std::string executor_id;
    {
      absl::MutexLock lock(&mu_);
      auto runnable = [this] {
        mu_.AssertHeld();
        return !detached_.empty() || exiting_;
      };
      mu_.Await(absl::Condition(&runnable));
      if (exiting_) return;
      executor_id = std::move(detached_.front());
      detached_.pop_front();
    }
    BackUpTasksOf(executor_id);
  }
}

void Presence::BackUpTasksOf(const std::string& executor_id) {
  {
    absl::MutexLock lock(&mu_);
    if (attached_.contains(executor_id)) return;  // back already
  }
  if (hooks_.lost) hooks_.lost(executor_id, clock_->Now());
  absl::StatusOr<std::vector<Task>> running = store_->ListRunningTasks();
  if (!running.ok()) {
    MINIONS_LOG(Warning) << "executor=" << executor_id << " closed its connection; its tasks wait for their lease TTL: "
                         << running.status().message();
    return;
  }
  const absl::Time now = clock_->Now();
  int backed_up = 0;
  for (const Task& task : *running) {
    if (task.executor_id != executor_id) continue;
    absl::StatusOr<Task> backed = store_->RequestBackup(task.job_id, task.index, task.attempt, now);
    if (!backed.ok()) continue;  // finished, handed back, or backed up already meanwhile
    ++backed_up;
    MINIONS_LOG(Info) << "job=" << task.job_id << " task=" << task.index << " attempt=" << task.attempt
                      << " executor=" << executor_id
                      << " closed its connection without handing the task back; a backup attempt may run elsewhere";
  }
  if (backed_up == 0) return;
  {
    absl::MutexLock lock(&mu_);
    ++detached_abruptly_;
  }
  if (hooks_.work_arrived) hooks_.work_arrived();
}

int64_t Presence::attached() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, streams] : attached_) n += streams;
  return n;
}

int64_t Presence::detached_abruptly() const {
  absl::MutexLock lock(&mu_);
  return detached_abruptly_;
}

}  // namespace minions

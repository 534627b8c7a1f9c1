#include "watchdog/watchdog.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace minions {

absl::StatusOr<WatchdogPass> Watchdog::Tick(absl::Time now) {
  WatchdogPass pass;
  std::set<std::string> jobs;
  auto expired = store_->ExpireLeases(now, options_.batch);
  if (!expired.ok()) return expired.status();
  for (const Task& task : *expired) {
    ++pass.leases_expired;
    if (task.state == TaskState::kFailed) ++pass.tasks_failed;
    jobs.insert(task.job_id);
    MINIONS_LOG(Info) << "job=" << task.job_id << " task=" << task.index << " lease expired; now "
                      << TaskStateName(task.state) << " (" << task.last_error << ")";
  }
  auto lost = store_->MarkLostExecutors(now - options_.executor_timeout, now);
  if (!lost.ok()) return lost.status();
  for (const Executor& e : *lost) {
    ++pass.executors_lost;
    MINIONS_LOG(Warning) << "executor=" << e.id << " (" << e.info.name << ") lost: no heartbeat since "
                         << absl::FormatTime(e.last_heartbeat_at);
  }
  pass.jobs_touched.assign(jobs.begin(), jobs.end());
  if (leases_expired_) {
    leases_expired_->Increment(pass.leases_expired);
    actions_->With({"requeue_task"})->Increment(pass.leases_expired - pass.tasks_failed);
    actions_->With({"fail_task"})->Increment(pass.tasks_failed);
    actions_->With({"mark_executor_lost"})->Increment(pass.executors_lost);
  }
  return pass;
}

void Watchdog::ExportMetrics(metrics::Registry* registry) {
  leases_expired_ = registry->AddCounter("minions_leases_expired_total",
                                         "Leases the watchdog found expired (their holder stopped heartbeating).");
  actions_ = registry->AddCounterFamily(
      "minions_watchdog_actions_total",
      "What the watchdog did: requeue_task (an expired lease, retried elsewhere), fail_task (an expired "
      "lease that used up the task's attempts), mark_executor_lost (missed heartbeats).",
      {"action"});
  // Zero series from the start, so rate() and dashboards see them before the first action.
  for (const char* action : {"requeue_task", "fail_task", "mark_executor_lost"}) actions_->With({action});
}

absl::StatusOr<std::unique_ptr<WatchdogLock>> WatchdogLock::TryAcquire(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open lock file '", path, "': ", std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::UnavailableError("another watchdog is active");
  }
  return std::unique_ptr<WatchdogLock>(new WatchdogLock(fd));
}

WatchdogLock::~WatchdogLock() { ::close(fd_); }

}  // namespace minions

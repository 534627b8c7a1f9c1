// ExecutorAgent, owner first: how the agent obeys the AvailabilityController's WorkMode. Kept
// apart from agent.cc so the leasing pipeline and the yielding mechanics read separately.
//
//   run       lease and feed as usual
//   throttle  as run, with the runner stopped half of every second (thermal "fair")
//   pause     lease nothing, feed nothing, cancel the batches in the runner: it stops at its
//             next decode step, keeping what it finished; one still busy after the grace is
//             SIGSTOPped (its tasks stay leased, heartbeats go on)
//   release   as pause, and the runner is ended so its memory returns to the owner; its tasks
//             wait, queued, for a new runner
//   stop      every task not finished is handed back as preempted (never counted as a failure)
//             and the runner is ended

#include <signal.h>

#include <algorithm>

#include "common/logging.h"
#include "executor/agent.h"

namespace minions {

bool ExecutorAgent::HoldsWork() const {
  {
    absl::MutexLock lock(&mu_);
    if (holds_work_) return true;
  }
  return runner_.running();
}

int ExecutorAgent::RunnerPid() const { return runner_.pid(); }

std::string ExecutorAgent::FleetState(bool has_tasks, std::string* reason) const {
  {
    absl::MutexLock lock(&mu_);
    if (drain_) return "draining";
  }
  if (gate_) {
    *reason = gate_->Reason();
    return gate_->FleetState(has_tasks);
  }
  return has_tasks ? "busy" : "available";
}

void ExecutorAgent::ReleaseRunner(absl::Time now) {
  if (!runner_.running()) return;
  const pid_t pid = runner_.pid();
  // Records with an output stay done (and may be in a checkpoint already): a new runner runs
  // only the rest.
  std::vector<TaskPtr> rerun = DropRunner();
  for (TaskPtr task : rerun) task->OnRunnerGone();
  queue_.insert(queue_.begin(), rerun.begin(), rerun.end());
  MINIONS_LOG(Info) << "released the runner (pid " << pid << "); " << rerun.size() << " tasks wait for the owner";
}

void ExecutorAgent::HandBack(const char* why) {
  int handed = 0;
  std::vector<TaskPtr> held;
  for (const auto& [key, task] : tasks_) held.push_back(task.get());
  for (TaskPtr task : held) {
    if (std::find(to_complete_.begin(), to_complete_.end(), task) != to_complete_.end()) continue;  // done: complete it
    GiveUp(task, absl::AbortedError(why), FailureClass::kPreempted);
    ++handed;
  }
  if (handed) MINIONS_LOG(Info) << "handed " << handed << " tasks back (preempted): " << why;
}

void ExecutorAgent::ObserveYield(absl::Time now) {
  // Once per time the owner takes the machine: from leaving run to the runner no longer using it
  // (stopped, or gone); the pause -> release -> stop steps that may follow are not new yields.
  if (!options_.metrics || yield_observed_) return;
  yield_observed_ = true;
  options_.metrics->ObserveYieldSeconds(absl::ToDoubleSeconds(now - gate_->mode_since()));
}

bool ExecutorAgent::ApplyWorkMode(absl::Time now) {
  if (!gate_) return false;
  const WorkMode mode = gate_->mode();
  bool exiting;
  {
    absl::MutexLock lock(&mu_);
    exiting = stop_ || drain_;
  }
  if (exiting && mode != WorkMode::kRun && mode != WorkMode::kThrottle) {
    // Asked to exit while the owner has the machine: the tasks cannot finish here, so they go
    // back now (preempted) rather than holding the exit until the owner leaves.
    ReleaseRunner(now);
    HandBack("the machine's owner needs it");
    return true;
  }
  // A gang member's owner never waits for the gang: its rpc-server goes at once (the leader's
  // attempt ends, preempted, and resumes on another gang).
  if (mode != WorkMode::kRun && mode != WorkMode::kThrottle) EndDuties("the machine's owner needs it");
  const bool busy = RunnerBusy();
  switch (mode) {
    case WorkMode::kRun:
      yield_observed_ = false;
      if (runner_.frozen()) runner_.Freeze(false, now);
      return false;
    case WorkMode::kThrottle:
      yield_observed_ = false;
      if (now >= next_throttle_toggle_) {
        runner_.Freeze(!runner_.frozen() && busy, now);
        next_throttle_toggle_ = now + absl::Milliseconds(500);
      }
      return false;
    case WorkMode::kPause:
      // Fed nothing more, and every batch in the runner cancelled: the runner stops at its next
      // decode step rather than at the end of a batch (which may take minutes). What it finished
      // stays done; the rest waits, leased, for the owner to leave (FinishTask, kYielded). A
      // runner still busy past the grace (one that ignores `cancel`, a long step) is stopped.
      if (busy && !runner_.frozen() && runner_.running()) {
        for (const auto& [batch, task] : batches_) {
          if (task->yielding() || task->cancelled()) continue;
          task->Yield();
          runner_.Cancel(batch);
        }
      }
      if (busy && !runner_.frozen() && now - gate_->mode_since() >= gate_->pause_grace()) {
        runner_.Freeze(true, now);
        MINIONS_LOG(Info) << "runner stopped (SIGSTOP): the owner is back and it has not stopped its batch";
        // Its batch_done waits for the owner to leave: what it finished is checkpointed now.
        for (const auto& [batch, task] : batches_) MaybeCheckpoint(task, now, /*now_anyway=*/true);
      }
      if (!busy || runner_.frozen()) ObserveYield(now);  // idle at its batch boundary, or stopped
      return true;
    case WorkMode::kRelease:
      ReleaseRunner(now);
      ObserveYield(now);
      return true;
    case WorkMode::kStop:
      ReleaseRunner(now);
      HandBack("the machine's owner needs it");
      ObserveYield(now);
      return true;
  }
  return false;
}

}  // namespace minions

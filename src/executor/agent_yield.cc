// ExecutorAgent, owner first: how the agent obeys the AvailabilityController's WorkMode. Kept
// apart from agent.cc so the leasing pipeline and the yielding mechanics read separately.
//
//   run       lease and feed as usual
//   throttle  as run, with the runner stopped half of every second (thermal "fair")
//   pause     lease nothing, feed nothing: the runner stops at its next batch boundary; one
//             still busy after the grace is SIGSTOPped (its tasks stay leased, heartbeats go on)
//   release   as pause, and the runner is ended so its memory returns to the owner; its tasks
//             wait, staged, for a new runner
//   stop      every task not finished is handed back as preempted (never counted as a failure)
//             and the runner is ended

#include <signal.h>

#include <algorithm>

#include "common/logging.h"
#include "executor/agent.h"

namespace minions {

bool ExecutorAgent::HoldsWork() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !active_.empty() || runner_ != nullptr;
}

int ExecutorAgent::RunnerPid() const {
  std::lock_guard<std::mutex> lock(mu_);
  return runner_ ? runner_->pid() : 0;
}

void ExecutorAgent::SignalRunner(int sig) {
  std::lock_guard<std::mutex> lock(mu_);
  if (runner_) ::kill(runner_->pid(), sig);
  frozen_ = sig == SIGSTOP;
}

std::string ExecutorAgent::FleetState(bool has_tasks, std::string* reason) const {
  if (drain_) return "draining";
  if (gate_) {
    *reason = gate_->Reason();
    return gate_->FleetState(has_tasks);
  }
  return has_tasks ? "busy" : "available";
}

void ExecutorAgent::ReleaseRunner() {
  std::unique_ptr<RunnerProcess> runner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    runner = std::move(runner_);
  }
  frozen_ = false;
  loaded_model_.clear();
  loaded_options_.clear();
  if (!runner) return;
  batches_.clear();
  std::vector<TaskPtr> rerun;
  for (const auto& task : ActiveTasks()) {
    if (!task->in_runner) continue;
    task->in_runner = false;
    // Records with an output stay done (and may be in a checkpoint already): a new runner runs
    // only the rest (FeedRunner takes the unfinished records, or the task's isolation groups).
    if (task->suspect && !task->batch_records.empty()) {
      std::vector<size_t> left;
      for (size_t i : task->batch_records) {
        if (!task->outputs[i]) left.push_back(i);
      }
      if (!left.empty()) task->isolation.push_front(std::move(left));
    }
    rerun.push_back(task);
  }
  std::sort(rerun.begin(), rerun.end(), [](const TaskPtr& a, const TaskPtr& b) { return a->started < b->started; });
  staged_.insert(staged_.begin(), rerun.begin(), rerun.end());
  pid_t pid = runner->pid();
  runner.reset();  // SIGKILL and reap: the memory is the owner's again
  MINIONS_LOG(Info) << "released the runner (pid " << pid << "); " << rerun.size() << " tasks wait for the owner";
}

void ExecutorAgent::HandBack() {
  std::vector<TaskPtr> finished(to_complete_.begin(), to_complete_.end());
  staged_.clear();
  int handed = 0;
  for (const auto& task : ActiveTasks()) {
    if (std::find(finished.begin(), finished.end(), task) != finished.end()) continue;  // done: complete it
    Report(task, absl::AbortedError("the machine's owner needs it"), FailureClass::kPreempted);
    Forget(task);
    ++handed;
  }
  if (handed) MINIONS_LOG(Info) << "handed " << handed << " tasks back (preempted)";
}

void ExecutorAgent::ObserveYield(absl::Time now) {
  // Once per time the owner takes the machine: from leaving run to the runner no longer using it
  // (stopped, or gone); the pause -> release -> stop steps that may follow are not new yields.
  if (!options_.metrics || yield_observed_) return;
  yield_observed_ = true;
  options_.metrics->ObserveYieldSeconds(absl::ToDoubleSeconds(now - gate_->mode_since()));
}

bool ExecutorAgent::ApplyWorkMode() {
  if (!gate_) return false;
  WorkMode mode = gate_->mode();
  absl::Time now = clock_->Now();
  if ((stop_ || drain_) && mode != WorkMode::kRun && mode != WorkMode::kThrottle) {
    // Asked to exit while the owner has the machine: the tasks cannot finish here, so they go
    // back now (preempted) rather than holding the exit until the owner leaves.
    ReleaseRunner();
    HandBack();
    return true;
  }
  bool busy = false;
  for (const auto& task : ActiveTasks()) busy |= task->in_runner;
  switch (mode) {
    case WorkMode::kRun:
      yield_observed_ = false;
      if (frozen_) SignalRunner(SIGCONT);
      return false;
    case WorkMode::kThrottle:
      yield_observed_ = false;
      if (now >= next_throttle_toggle_) {
        SignalRunner(frozen_ || !busy ? SIGCONT : SIGSTOP);
        next_throttle_toggle_ = now + absl::Milliseconds(500);
      }
      return false;
    case WorkMode::kPause:
      // Fed nothing more, the runner stops at its next batch boundary; past the grace it is stopped.
      if (busy && !frozen_ && now - gate_->mode_since() >= gate_->pause_grace()) {
        SignalRunner(SIGSTOP);
        MINIONS_LOG(Info) << "runner stopped (SIGSTOP): the owner is back and its batch is not done";
      }
      if (!busy || frozen_) ObserveYield(now);  // idle at its batch boundary, or stopped
      return true;
    case WorkMode::kRelease:
      ReleaseRunner();
      ObserveYield(now);
      return true;
    case WorkMode::kStop:
      ReleaseRunner();
      HandBack();
      ObserveYield(now);
      return true;
  }
  return false;
}

}  // namespace minions

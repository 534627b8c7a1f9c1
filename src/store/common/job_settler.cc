#include "store/common/job_settler.h"

#include <algorithm>

#include "common/status_macros.h"
#include "model/state_machines.h"
#include "store/common/row_access.h"

namespace minions {
namespace {

// Only a job whose tasks run: one still validating has none yet.
bool Unsettled(const Job& job) {
  return job.tasks_done >= job.n_tasks && (job.state == JobState::kQueued || job.state == JobState::kRunning);
}

}  // namespace

void JobSettler::CountEnded(AttemptWrites& writes, absl::Time now) {
  for (const Task& task : writes.tasks) {
    if (IsTerminal(task.state)) CountTerminalTask(writes.counts[task.job_id], task, now);
  }
}

absl::Status JobSettler::EndAndSettle(RowTransaction& t, const AttemptWrites& writes, absl::Time now,
                                      Settlement& settlement) {
  if (writes.empty()) return absl::OkStatus();
  if (store_.settling() == Settling::kAfterCommit) return t.EndAttempts(writes, now, &settlement.later);
  std::set<std::string> finished;
  RETURN_IF_ERROR(t.EndAttempts(writes, now, &finished));
  for (const std::string& job_id : finished) {
    ASSIGN_OR_RETURN(bool finalizing, SettleIfDone(t, job_id, now));
    if (finalizing) settlement.finalizing.push_back(job_id);
  }
  return absl::OkStatus();
}

absl::Status JobSettler::EndOnly(RowTransaction& t, const AttemptWrites& writes, absl::Time now) {
  if (writes.empty()) return absl::OkStatus();
  return t.EndAttempts(writes, now, /*finished=*/nullptr);
}

std::vector<std::string> JobSettler::Settle(const Settlement& settlement, absl::Time now) {
  std::vector<std::string> finalizing = settlement.finalizing;
  if (!settlement.later.empty()) {
    std::vector<std::string> settled;
    absl::Status done = store_.Run(TransactionKind::kWrite, [&](RowTransaction& t) -> absl::Status {
      settled.clear();
      for (const std::string& job_id : settlement.later) {
        ASSIGN_OR_RETURN(bool ready, SettleIfDone(t, job_id, now));
        if (ready) settled.push_back(job_id);
      }
      return absl::OkStatus();
    });
    // Nothing of it was written otherwise: the sweep settles them.
    if (done.ok()) finalizing.insert(finalizing.end(), settled.begin(), settled.end());
  }
  std::sort(finalizing.begin(), finalizing.end());
  return finalizing;
}

absl::StatusOr<bool> JobSettler::SettleIfDone(RowTransaction& t, const std::string& job_id, absl::Time now) {
  ASSIGN_OR_RETURN(Job job, row_access::LoadJob(t, job_id, Locking::kNone));
  if (!Unsettled(job)) return false;
  // Lock it and look again.
  ASSIGN_OR_RETURN(job, row_access::LoadJob(t, job_id));
  if (!Unsettled(job)) return false;
  std::string last_error;
  if (job.tasks_succeeded == 0) {
    ASSIGN_OR_RETURN(last_error, t.LastFailure(job_id));
  }
  if (!SettleJob(job, last_error, now)) return false;
  RETURN_IF_ERROR(t.Update(RowWrites{.jobs = {job}}));
  return job.state == JobState::kFinalizing;
}

absl::Status JobSettler::SweepUnsettled(RowTransaction& t, absl::Time now) {
  // Read without locks; SettleIfDone locks each and looks again.
  ASSIGN_OR_RETURN(std::vector<std::string> unsettled, t.UnsettledJobs());
  for (const std::string& job_id : unsettled) RETURN_IF_ERROR(SettleIfDone(t, job_id, now).status());
  return absl::OkStatus();
}

}  // namespace minions

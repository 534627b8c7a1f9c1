#include "store/common/verification_operations.h"

#include <algorithm>
#include <utility>

#include <functional>
#include <map>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "store/common/row_access.h"
#include "model/state_machines.h"
#include "store/common/store_rules.h"

namespace minions {

absl::StatusOr<Executor> VerificationOperations::RecordVerification(const Verification& verification,
                                                                    absl::Time now) {
  if (verification.producer_id == verification.verifier_id) {
    return absl::InvalidArgumentError("an executor cannot verify its own answers");
  }
  if (verification.custom_id.empty()) return absl::InvalidArgumentError("a verification names the record it checked");
  Verification row = verification;
  row.at = now;
  if (row.passed) row.reason.clear();
  if (row.reason.size() > kMaxVerificationReason) row.reason.resize(kMaxVerificationReason);
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Executor> {
    // Lock order: executors (in id order), then jobs.
    ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.executors = {row.producer_id, row.verifier_id}}));
    auto producer = rows.executors.find(row.producer_id);
    if (producer == rows.executors.end()) return row_access::NoExecutor(row.producer_id);
    if (!rows.executors.contains(row.verifier_id)) return row_access::NoExecutor(row.verifier_id);
    ASSIGN_OR_RETURN(Job job, row_access::LoadJob(t, row.job_id, Locking::kNone));
    (void)job;
    RETURN_IF_ERROR(t.InsertVerification(row));
    if (row.passed) return producer->second;
    Quarantine(producer->second, row);
    RETURN_IF_ERROR(t.Update(RowWrites{.executors = {producer->second}}, /*last=*/true));
    return producer->second;
  });
}

absl::StatusOr<std::vector<Verification>> VerificationOperations::ListVerifications(const std::string& job_id) {
  return RunTransaction(store_, TransactionKind::kRead,
                        [&](RowTransaction& t) -> absl::StatusOr<std::vector<Verification>> {
                          RETURN_IF_ERROR(row_access::LoadJob(t, job_id, Locking::kNone).status());
                          return t.VerificationsOfJob(job_id);
                        });
}

absl::StatusOr<Executor> VerificationOperations::ReleaseExecutor(const std::string& executor_id, absl::Time now) {
  (void)now;
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Executor> {
    ASSIGN_OR_RETURN(Executor executor, row_access::LoadExecutor(t, executor_id));
    RETURN_IF_ERROR(Release(executor));
    RETURN_IF_ERROR(t.Update(RowWrites{.executors = {executor}}, /*last=*/true));
    return executor;
  });
}

absl::Status VerificationOperations::DrawSpotChecks(RowTransaction& t, const StoreOptions& options,
                                                    const Task& before, Task& after, const std::string& producer,
                                                    int64_t producer_records_done, absl::Time now) {
  if (after.chunks.size() <= before.chunks.size() || producer.empty()) return absl::OkStatus();
  // The job's team may check more (or less, never none) than the fleet: read without locks (jobs
  // and teams come after the tasks and executors this transaction holds, in the lock order), and
  // only where a fraction applies (a new producer's first records are all drawn whatever it is).
  VerificationPolicy policy = options.verification;
  int64_t done_before_last = producer_records_done;
  for (size_t i = before.chunks.size(); i + 1 < after.chunks.size(); ++i) {
    done_before_last += after.chunks[i].end - after.chunks[i].begin;
  }
  if (options.spot_checks && done_before_last >= policy.all_until_records) {
    ASSIGN_OR_RETURN(Job job, row_access::LoadJob(t, after.job_id, Locking::kNone));
    ASSIGN_OR_RETURN(Rows teams, t.Read(RowKeys{.teams = {job.spec.team}}, Locking::kNone));
    if (auto team = teams.teams.find(job.spec.team); team != teams.teams.end()) {
      policy = PolicyForTeam(policy, team->second.verify_fraction);
    }
  }
  // Unpredictable to the executor: the draws are never shown to it, and each thread's generator
  // is seeded from the system's entropy.
  static thread_local std::mt19937_64 random{std::random_device{}()};
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const std::function<double()> uniform = [&] { return unit(random); };
  std::vector<VerificationTask> drawn;
  for (size_t i = before.chunks.size(); i < after.chunks.size(); ++i) {
    Chunk& chunk = after.chunks[i];
    if (chunk.executor_id.empty()) chunk.executor_id = producer;
    if (!options.spot_checks) continue;
    std::vector<int64_t> records = DrawRecords(chunk, policy, producer_records_done, uniform);
    producer_records_done += chunk.end - chunk.begin;
    if (records.empty()) continue;
    drawn.push_back(VerificationTask{after.job_id, after.index, chunk.attempt, chunk.seq, chunk.executor_id,
                                     std::move(records), "", std::nullopt, now});
  }
  if (drawn.empty()) return absl::OkStatus();
  return t.InsertVerificationTasks(drawn);
}

namespace {

// Which candidates `verifier` may take, best first. A witness unlike the producer is the better
// one: of another owner (Executor::owner: an owner's machines may collude, or share a fault), then
// of another chip, accelerator or GPU (a faulty core's errors and a backend's float noise are the
// producer's own, and an honest verifier of the same kind would share them). Arbitrations come
// first (a producer wrongly quarantined idles until judged), and go only to an arbiter that
// MayArbitrate. Oldest first within each rank. The producers and disputed verifiers are read
// without locks (the store's lock order puts executors first, in id order, and this one is
// locked already).
absl::Status RankCandidates(RowTransaction& t, const Executor& verifier, std::vector<VerificationTask>& candidates) {
  RowKeys keys;
  for (const VerificationTask& task : candidates) {
    keys.executors.push_back(task.producer_id);
    if (!task.disputed_verifier.empty()) keys.executors.push_back(task.disputed_verifier);
  }
  if (keys.executors.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Rows rows, t.Read(keys, Locking::kNone));
  auto owner_of = [&](const std::string& id) {
    auto found = rows.executors.find(id);
    return found == rows.executors.end() ? std::string() : found->second.owner;
  };
  auto rank = [&](const VerificationTask& task) {
    const std::string producer_owner = owner_of(task.producer_id);
    const bool other_owner = !producer_owner.empty() && !verifier.owner.empty() && producer_owner != verifier.owner;
    bool alike = true;
    if (auto producer = rows.executors.find(task.producer_id); producer != rows.executors.end()) {
      const ExecutorInfo& p = producer->second.info;
      alike = p.chip == verifier.info.chip && p.accelerator == verifier.info.accelerator && p.gpu == verifier.info.gpu;
    }
    return (task.disputed_verifier.empty() ? 4 : 0) + (other_owner ? 0 : 2) + (alike ? 1 : 0);
  };
  std::erase_if(candidates, [&](const VerificationTask& task) {
    return !task.disputed_verifier.empty() &&
           !MayArbitrate(verifier.owner, owner_of(task.producer_id), owner_of(task.disputed_verifier));
  });
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const VerificationTask& a, const VerificationTask& b) { return rank(a) < rank(b); });
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<VerificationTask>> VerificationOperations::LeaseVerifications(const std::string& executor_id,
                                                                                         int max_tasks,
                                                                                         absl::Duration ttl,
                                                                                         absl::Time now) {
  using Leased = std::vector<VerificationTask>;
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Leased> {
    Leased leased;
    ASSIGN_OR_RETURN(Executor executor, row_access::LoadExecutor(t, executor_id));
    if (!store_rules::MayLease(executor, max_tasks)) return leased;
    // A few more than asked for: some may need what this executor cannot run.
    ASSIGN_OR_RETURN(Leased candidates, t.LeasableVerificationTasks(executor_id, now, int64_t{max_tasks} * 4));
    RETURN_IF_ERROR(RankCandidates(t, executor, candidates));
    std::map<std::string, Job> jobs;
    for (VerificationTask& task : candidates) {
      if (static_cast<int>(leased.size()) >= max_tasks) break;
      auto job = jobs.find(task.job_id);
      if (job == jobs.end()) {
        ASSIGN_OR_RETURN(Job loaded, row_access::LoadJob(t, task.job_id, Locking::kNone));
        job = jobs.emplace(task.job_id, std::move(loaded)).first;
      }
      // The verifier loads the job's model and runner: it must be able to run the job itself.
      if (!store_rules::MayPlace(executor, job->second, now, absl::ZeroDuration())) continue;
      task.verifier_id = executor_id;
      task.lease_expires_at = now + ttl;
      RETURN_IF_ERROR(t.UpdateVerificationTask(task));
      leased.push_back(std::move(task));
    }
    return leased;
  });
}

absl::StatusOr<VerificationTask> VerificationOperations::GetVerificationTask(const VerificationTask& key) {
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) -> absl::StatusOr<VerificationTask> {
    ASSIGN_OR_RETURN(std::optional<VerificationTask> task,
                     t.GetVerificationTask(key.job_id, key.task_index, key.attempt, key.seq));
    if (!task) {
      return absl::NotFoundError(absl::StrCat("no verification task for chunk ", key.seq, " of attempt ", key.attempt,
                                              " of task ", key.job_id, "/", key.task_index));
    }
    return *std::move(task);
  });
}

namespace {

// What redoing a quarantined producer's work writes (RedoProducerWork).
struct Redo {
  AttemptWrites ended;                   // tasks back to pending, their jobs' counts taken back
  std::vector<Job> reopened;             // jobs finalizing that run again
  std::vector<VerificationTask> stale;   // spot checks of chunks that are gone
};

// Every task of a job not yet published (queued, running, finalizing) that holds a chunk of
// `producer` gets its records from that chunk on redone elsewhere (model RedoChunksOf). Locks the
// tasks, job by job in id order (tasks come first in the store's lock order).
absl::StatusOr<Redo> RedoProducerWork(RowTransaction& t, const std::string& producer, const std::string& why,
                                      absl::Time now) {
  Redo redo;
  std::map<std::string, Job> jobs;
  for (JobState state : {JobState::kQueued, JobState::kRunning, JobState::kFinalizing}) {
    ASSIGN_OR_RETURN(std::vector<Job> found, t.JobsInState(state, 0));
    for (Job& job : found) jobs.emplace(job.id, std::move(job));
  }
  for (auto& [job_id, job] : jobs) {
    ASSIGN_OR_RETURN(std::vector<Task> tasks, t.TasksOfJob(job_id));
    bool reopen = false;
    for (Task& task : tasks) {
      const Task before = task;
      std::vector<Chunk> dropped = RedoChunksOf(task, producer, why);
      if (dropped.empty()) continue;
      if (before.state == TaskState::kRunning) {
        redo.ended.charges[job_id] += store_rules::EndedAttemptTime(before, task, now);
      }
      if (IsTerminal(before.state)) {
        UncountRedoneTask(redo.ended.counts[job_id], before);
        reopen = true;
      }
      for (const Chunk& chunk : dropped) {
        redo.stale.push_back(VerificationTask{job_id, task.index, chunk.attempt, chunk.seq});
      }
      redo.ended.tasks.push_back(std::move(task));
    }
    if (reopen && job.state == JobState::kFinalizing) {
      ReopenJob(job, now);
      redo.reopened.push_back(job);
    }
  }
  return redo;
}

}  // namespace

namespace {

// The holder of `task`'s lease reporting `verdicts`: InvalidArgument unless they name the task's
// records in order, each checked one with its custom_id.
absl::Status CheckVerdicts(const VerificationTask& task, const std::vector<RecordVerdict>& verdicts) {
  if (verdicts.size() != task.records.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the task has ", task.records.size(), " records; ", verdicts.size(),
                                                   " verdicts were reported"));
  }
  for (size_t i = 0; i < verdicts.size(); ++i) {
    // A record whose input line is not JSON has no custom_id: its error line is the chunk
    // checks' to judge, and a verdict on it may only say it was not checked.
    if (verdicts[i].record != task.records[i] || (verdicts[i].checked && verdicts[i].custom_id.empty())) {
      return absl::InvalidArgumentError(absl::StrCat("verdict ", i, " must name record ", task.records[i],
                                                     " and its custom_id"));
    }
  }
  return absl::OkStatus();
}

// The records a report failed (checked and not passed), in order.
std::vector<const RecordVerdict*> Failures(const std::vector<RecordVerdict>& verdicts) {
  std::vector<const RecordVerdict*> failed;
  for (const RecordVerdict& verdict : verdicts) {
    if (verdict.checked && !verdict.passed) failed.push_back(&verdict);
  }
  return failed;
}

// The chunk a spot check names, as its task holds it before a redo drops it (read without locks:
// the redo locks the task, in the store's lock order); nullopt when the task no longer holds it.
absl::StatusOr<std::optional<Chunk>> ChunkOf(RowTransaction& t, const VerificationTask& check) {
  const TaskId key{check.job_id, check.task_index};
  ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.tasks = {key}}, Locking::kNone));
  auto task = rows.tasks.find(key);
  if (task == rows.tasks.end()) return std::optional<Chunk>();
  for (const Chunk& chunk : task->second.chunks) {
    if (chunk.attempt == check.attempt && chunk.seq == check.seq) return std::optional<Chunk>(chunk);
  }
  return std::optional<Chunk>();
}

// Keeps each checked verdict of `verifier` on `task`'s producer; true when one that failed was
// new (a record judged already, drawn twice, is not judged again).
absl::StatusOr<bool> KeepVerdicts(RowTransaction& t, const VerificationTask& task, const std::string& verifier,
                                  const std::vector<RecordVerdict>& verdicts, Executor& producer, absl::Time now) {
  bool failed = false;
  for (const RecordVerdict& verdict : verdicts) {
    if (!verdict.checked) continue;  // says nothing about the producer
    Verification row{task.job_id, task.task_index, verdict.custom_id, task.producer_id, verifier,
                     verdict.passed, verdict.passed ? "" : verdict.reason, now};
    if (row.reason.size() > kMaxVerificationReason) row.reason.resize(kMaxVerificationReason);
    absl::Status inserted = t.InsertVerification(row);
    if (absl::IsAlreadyExists(inserted)) continue;
    RETURN_IF_ERROR(inserted);
    if (!row.passed && !failed) {
      Quarantine(producer, row);
      failed = true;
    }
  }
  return failed;
}

}  // namespace

absl::StatusOr<Executor> VerificationOperations::ReportVerifications(const std::string& verifier_id,
                                                                     const VerificationTask& key,
                                                                     const std::vector<RecordVerdict>& verdicts,
                                                                     absl::Time now) {
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Executor> {
    ASSIGN_OR_RETURN(std::optional<VerificationTask> task,
                     t.GetVerificationTask(key.job_id, key.task_index, key.attempt, key.seq));
    if (!task) {
      return absl::NotFoundError(absl::StrCat("no verification task for chunk ", key.seq, " of attempt ", key.attempt,
                                              " of task ", key.job_id, "/", key.task_index,
                                              " (it was reported, or its job is gone)"));
    }
    // Only the holder of the task's lease, while it holds it, may judge: anyone else's verdicts
    // (the producer's above all) would be forged evidence.
    if (task->verifier_id != verifier_id || !task->lease_expires_at || *task->lease_expires_at <= now) {
      return absl::PermissionDeniedError(absl::StrCat("executor ", verifier_id,
                                                      " does not hold the lease of this verification task"));
    }
    RETURN_IF_ERROR(CheckVerdicts(*task, verdicts));
    const std::vector<const RecordVerdict*> failed = Failures(verdicts);
    // An arbitration rules on the disputed verifier's failures; a spot check that fails a record
    // is itself arbitrated (below).
    const std::string& disputed = task->disputed_verifier;
    const Ruling ruling = disputed.empty() ? (failed.empty() ? Ruling::kUndecided : Ruling::kUpheld) : Rule(verdicts);
    std::optional<Chunk> chunk;
    if (disputed.empty() && !failed.empty()) {
      ASSIGN_OR_RETURN(chunk, ChunkOf(t, *task));
    }
    // Whose work in jobs not yet published is redone: the producer's when a record failed, the
    // verifier's when an arbiter overrules it. Its tasks are locked first, before the executors
    // (the store's lock order).
    Redo redo;
    if (ruling == Ruling::kUpheld) {
      ASSIGN_OR_RETURN(redo, RedoProducerWork(t, task->producer_id,
                                              absl::StrCat("redone: its producer ", task->producer_id,
                                                           " failed verification of record ", failed[0]->custom_id),
                                              now));
    } else if (ruling == Ruling::kOverturned) {
      ASSIGN_OR_RETURN(redo, RedoProducerWork(t, disputed,
                                              absl::StrCat("redone: its producer ", disputed,
                                                           " was overruled by arbitration as a verifier"),
                                              now));
    }
    RowKeys keys{.executors = {task->producer_id, verifier_id}};
    if (!disputed.empty()) keys.executors.push_back(disputed);
    ASSIGN_OR_RETURN(Rows rows, t.Read(keys));
    auto producer = rows.executors.find(task->producer_id);
    if (producer == rows.executors.end()) return row_access::NoExecutor(task->producer_id);
    auto verifier = rows.executors.find(verifier_id);
    if (verifier == rows.executors.end()) return row_access::NoExecutor(verifier_id);
    if (verifier->second.state == ExecutorState::kQuarantined || verifier->second.state == ExecutorState::kRevoked) {
      return absl::PermissionDeniedError(absl::StrCat("executor ", verifier_id, " is ",
                                                      std::string(ExecutorStateName(verifier->second.state)),
                                                      ": its verdicts are not taken"));
    }
    RowWrites writes{.jobs = redo.reopened};
    ASSIGN_OR_RETURN(bool newly_failed, KeepVerdicts(t, *task, verifier_id, verdicts, producer->second, now));
    if (newly_failed) writes.executors.push_back(producer->second);
    if (ruling == Ruling::kOverturned) {
      // The verifier is the suspect: quarantined, and the producer's quarantine lifted when it is
      // the one this verifier's failure put it in (its redone work stays redone).
      auto overruled = rows.executors.find(disputed);
      if (overruled != rows.executors.end()) {
        QuarantineOverruled(overruled->second, *task, verifier_id, verdicts.front().custom_id);
        writes.executors.push_back(overruled->second);
      }
      if (QuarantinedBy(producer->second, task->job_id, verdicts.front().custom_id, disputed)) {
        RETURN_IF_ERROR(Release(producer->second));
        writes.executors.push_back(producer->second);
      }
    }
    RETURN_IF_ERROR(t.DeleteVerificationTask(*task));
    for (const VerificationTask& stale : redo.stale) RETURN_IF_ERROR(t.DeleteVerificationTask(stale));
    if (newly_failed && disputed.empty() && chunk) {
      std::vector<int64_t> records;
      for (const RecordVerdict* verdict : failed) records.push_back(verdict->record);
      RETURN_IF_ERROR(t.InsertVerificationTasks(
          {ArbitrationOf(*task, verifier_id, std::move(records), chunk->begin, chunk->end, now)}));
    }
    if (!writes.empty()) RETURN_IF_ERROR(t.Update(writes, /*last=*/redo.ended.empty()));
    // Last: with Settling::kAfterCommit, EndAttempts is its transaction's last write.
    if (!redo.ended.empty()) RETURN_IF_ERROR(t.EndAttempts(redo.ended, now, nullptr));
    return producer->second;
  });
}

absl::StatusOr<int64_t> VerificationOperations::CountOpenVerifications(const std::string& job_id) {
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) -> absl::StatusOr<int64_t> {
    RETURN_IF_ERROR(row_access::LoadJob(t, job_id, Locking::kNone).status());
    return t.CountVerificationTasks(job_id);
  });
}

}  // namespace minions

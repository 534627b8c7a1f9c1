#include "model/verification.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "model/identity.h"
#include "model/state_machines.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace minions {

void Quarantine(Executor& producer, const Verification& failed) {
  if (producer.state == ExecutorState::kRevoked) return;
  producer.state = ExecutorState::kQuarantined;
  std::string reason = absl::StrCat("failed verification of ", failed.job_id, " record ", failed.custom_id,
                                    " (checked by ", failed.verifier_id, "): ", failed.reason);
  if (reason.size() > kMaxVerificationReason) reason.resize(kMaxVerificationReason);
  producer.state_reason = std::move(reason);
}

absl::Status Release(Executor& executor) {
  if (executor.state != ExecutorState::kQuarantined) {
    return absl::FailedPreconditionError(absl::StrCat("executor ", executor.id, " is ",
                                                      std::string(ExecutorStateName(executor.state)), ", not quarantined"));
  }
  executor.state = ExecutorState::kAvailable;
  executor.state_reason.clear();
  return absl::OkStatus();
}

std::vector<Chunk> RedoChunksOf(Task& task, const std::string& producer, const std::string& why) {
  std::vector<Chunk> dropped;
  if (task.state == TaskState::kCancelled || producer.empty()) return dropped;
  auto first = std::find_if(task.chunks.begin(), task.chunks.end(),
                            [&](const Chunk& c) { return c.executor_id == producer; });
  if (first == task.chunks.end()) return dropped;
  dropped.assign(first, task.chunks.end());
  task.chunks.erase(first, task.chunks.end());
  if (task.state != TaskState::kPending) {
    if (IsTerminal(task.state)) task.failures = 0;
    task.state = TaskState::kPending;
    task.lease_expires_at.reset();
    task.shadow.reset();
    task.finished_at.reset();
  }
  task.not_before.reset();
  task.records_done = CommittedRecords(task);
  task.records_failed = CommittedFailed(task);
  task.last_error = why;
  return dropped;
}

void UncountRedoneTask(Job& counts, const Task& revived) {
  if (!IsTerminal(revived.state)) return;
  Job added;
  CountTerminalTask(added, revived, absl::InfinitePast());
  counts.tasks_done -= added.tasks_done;
  counts.tasks_succeeded -= added.tasks_succeeded;
  counts.counts.completed -= added.counts.completed;
  counts.counts.failed -= added.counts.failed;
}

void ReopenJob(Job& job, absl::Time now) {
  if (job.state != JobState::kFinalizing) return;
  job.state = JobState::kRunning;
  job.updated_at = now;
}

Ruling Rule(const std::vector<RecordVerdict>& arbiter_verdicts) {
  bool all_passed = !arbiter_verdicts.empty();
  for (const RecordVerdict& v : arbiter_verdicts) {
    if (v.checked && !v.passed) return Ruling::kUpheld;
    all_passed = all_passed && v.checked;
  }
  return all_passed ? Ruling::kOverturned : Ruling::kUndecided;
}

std::string_view RulingName(Ruling ruling) {
  switch (ruling) {
    case Ruling::kUpheld: return "upheld";
    case Ruling::kOverturned: return "overturned";
    case Ruling::kUndecided: return "undecided";
  }
  return "undecided";
}

VerificationTask ArbitrationOf(const VerificationTask& spot_check, const std::string& verifier,
                               std::vector<int64_t> failed, int64_t chunk_begin, int64_t chunk_end, absl::Time now) {
  VerificationTask arbitration{spot_check.job_id, spot_check.task_index, spot_check.attempt, spot_check.seq,
                               spot_check.producer_id, std::move(failed), "", std::nullopt, now};
  arbitration.disputed_verifier = verifier;
  arbitration.chunk_begin = chunk_begin;
  arbitration.chunk_end = chunk_end;
  return arbitration;
}

bool MayArbitrate(const std::string& arbiter, const std::string& producer, const std::string& verifier) {
  return producer == verifier || (arbiter != producer && arbiter != verifier);
}

bool QuarantinedBy(const Executor& producer, const std::string& job_id, const std::string& custom_id,
                   const std::string& verifier) {
  // Quarantine's words, to the verifier's id; a reason cut at kMaxVerificationReason before it
  // (a very long custom_id) does not match, and the quarantine stands.
  return producer.state == ExecutorState::kQuarantined &&
         absl::StartsWith(producer.state_reason, absl::StrCat("failed verification of ", job_id, " record ", custom_id,
                                                              " (checked by ", verifier, "): "));
}

void QuarantineOverruled(Executor& verifier, const VerificationTask& arbitration, const std::string& arbiter,
                         const std::string& custom_id) {
  if (verifier.state == ExecutorState::kRevoked) return;
  verifier.state = ExecutorState::kQuarantined;
  std::string reason = absl::StrCat("overruled by arbitration: it failed ", arbitration.job_id, " record ", custom_id,
                                    " of ", arbitration.producer_id, ", which ", arbiter, " re-scored and passed");
  if (reason.size() > kMaxVerificationReason) reason.resize(kMaxVerificationReason);
  verifier.state_reason = std::move(reason);
}

VerificationPolicy PolicyForTeam(VerificationPolicy fleet, double team_fraction) {
  if (team_fraction != 0 && ValidateVerifyFraction(team_fraction).ok()) fleet.fraction = team_fraction;
  return fleet;
}

VerificationTally Tally(const std::vector<Verification>& verdicts) {
  VerificationTally tally;
  std::map<std::pair<int64_t, std::string>, bool> passed;  // record -> every verdict passed
  std::set<std::string> verifiers;
  for (const Verification& v : verdicts) {
    verifiers.insert(v.verifier_id);
    auto [it, added] = passed.emplace(std::make_pair(v.task_index, v.custom_id), v.passed);
    if (!v.passed && (added || it->second)) tally.failed_records.push_back(v.custom_id);
    if (!added) it->second = it->second && v.passed;
  }
  tally.checked = static_cast<int64_t>(passed.size());
  for (const auto& [record, ok] : passed) (ok ? tally.passed : tally.failed) += 1;
  tally.verifiers.assign(verifiers.begin(), verifiers.end());
  return tally;
}

std::string EncodeRecords(const std::vector<int64_t>& records) { return absl::StrJoin(records, ","); }

absl::StatusOr<std::vector<int64_t>> DecodeRecords(const std::string& text) {
  std::vector<int64_t> records;
  if (text.empty()) return records;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t r = 0;
    if (!absl::SimpleAtoi(part, &r) || r < 0) {
      return absl::DataLossError(absl::StrCat("a verification task's records are not indices: ", text));
    }
    records.push_back(r);
  }
  return records;
}

std::vector<int64_t> DrawRecords(const Chunk& chunk, const VerificationPolicy& policy, int64_t producer_records_done,
                                 const std::function<double()>& uniform) {
  std::vector<int64_t> drawn;
  const bool all = producer_records_done < policy.all_until_records;
  if (!all && policy.fraction <= 0) return drawn;
  for (int64_t r = chunk.begin; r < chunk.end; ++r) {
    if (!all && uniform() >= policy.fraction) continue;
    drawn.push_back(r);
  }
  // Too many (a new executor's big chunk): keep an unpredictable subset of max_records (a partial
  // Fisher-Yates shuffle), ascending again.
  const size_t keep = static_cast<size_t>(std::max<int64_t>(policy.max_records, 1));
  if (drawn.size() > keep) {
    for (size_t i = 0; i < keep; ++i) {
      const size_t left = drawn.size() - i;
      const size_t j = i + std::min(left - 1, static_cast<size_t>(uniform() * static_cast<double>(left)));
      std::swap(drawn[i], drawn[j]);
    }
    drawn.resize(keep);
    std::sort(drawn.begin(), drawn.end());
  }
  return drawn;
}

}  // namespace minions

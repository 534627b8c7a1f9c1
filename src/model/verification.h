#pragma once
// A verifier's verdict on one record of a producer's answer (verification by re-scoring, issue
// 38, docs/verification.md): what the store keeps per record checked, and the rule that a failed
// verdict quarantines the producer.
// Threads: plain values and pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "model/types.h"

namespace minions {

struct Verification {
  std::string job_id;
  int64_t task_index = 0;
  std::string custom_id;    // the record checked
  std::string producer_id;  // the executor whose answer was checked
  std::string verifier_id;  // the executor that checked it (never the producer)
  bool passed = false;
  std::string reason;       // why it failed; empty when it passed
  absl::Time at;

  bool operator==(const Verification&) const = default;
};

// The longest reason a Verification (and a quarantined executor's state_reason) keeps.
inline constexpr size_t kMaxVerificationReason = 1000;

// A failed verdict takes the producer out of service: state quarantined (it gets no leases, and
// nothing it says or re-registers lifts it; only ReleaseExecutor does), its state_reason naming
// the record and why. A revoked executor stays revoked.
void Quarantine(Executor& producer, const Verification& failed);
// Back in service after an admin's look: FailedPrecondition unless quarantined.
absl::Status Release(Executor& executor);

// What a job's verdicts add up to (its status and manifest): a record (task, custom_id) counts
// once however many verifiers judged it, and as failed when any of them failed it.
struct VerificationTally {
  int64_t checked = 0;
  int64_t passed = 0;
  int64_t failed = 0;
  std::vector<std::string> verifiers;       // sorted, each once
  std::vector<std::string> failed_records;  // custom_ids, in the order first failed

  bool operator==(const VerificationTally&) const = default;
};
VerificationTally Tally(const std::vector<Verification>& verdicts);

}  // namespace minions

#pragma once
// A verifier's verdict on one record of a producer's answer (verification by re-scoring, issue
// 38, docs/verification.md): what the store keeps per record checked, and the rule that a failed
// verdict quarantines the producer.
// Threads: plain values and pure functions.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
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

// A quarantined producer's work is redone: drops the task's committed chunks from the first one
// `producer` wrote (those after it resumed from it and go too), and puts a task that ended or
// runs on them back to pending, for another executor (a running attempt is then stopped by its
// next heartbeat; a revived task starts its failures afresh). A cancelled task is left alone.
// Returns the chunks dropped (none: the task is unchanged).
std::vector<Chunk> RedoChunksOf(Task& task, const std::string& producer, const std::string& why);
// A job whose finished task is redone (`revived`, as it was before RedoChunksOf) takes back what
// the task added to its counts: model CountTerminalTask, negated, in `counts` (a zeroed Job that
// the store adds to the job's); a job finalizing goes back to running.
void UncountRedoneTask(Job& counts, const Task& revived);
void ReopenJob(Job& job, absl::Time now);

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

// A spot check the server drew when a chunk committed (docs/verification.md, "Spot checks"):
// records of that chunk for an executor other than its producer to re-score. Pending until
// leased; a lease that expires makes it pending again; the verifier's report ends it (its
// verdicts are Verifications, and the row is gone).
struct VerificationTask {
  std::string job_id;
  int64_t task_index = 0;
  int attempt = 0;  // the chunk checked: the producer's attempt and its chunk number
  int seq = 0;
  std::string producer_id;
  std::vector<int64_t> records;  // task-relative indices, ascending, within the chunk
  std::string verifier_id;       // the holder of its lease; "" while pending
  std::optional<absl::Time> lease_expires_at;
  absl::Time created_at;
  // An arbitration ("" for a spot check): the verifier that failed these records of the chunk,
  // whose verdict a third executor (neither it nor the producer) now judges. Its chunk was redone,
  // so the task keeps the chunk's records [chunk_begin, chunk_end) that its Task no longer holds.
  std::string disputed_verifier;
  int64_t chunk_begin = 0;
  int64_t chunk_end = 0;

  bool operator==(const VerificationTask&) const = default;
};

// A verifier's answer on one record of a VerificationTask it holds.
struct RecordVerdict {
  int64_t record = 0;     // task-relative index: one of the task's records
  std::string custom_id;  // the record's, as the server read it from the job's input
  // false: the verifier could not check it (no model, too long for its context, a grammar): it
  // says nothing about the producer and records no verdict.
  bool checked = true;
  bool passed = false;
  std::string reason;     // why it failed
  bool operator==(const RecordVerdict&) const = default;
};

// --- arbitration (docs/verification.md, "Arbitration by a third") ---
// A verifier that fails a record is itself judged: the producer is quarantined at once (as for
// any failure) and a third executor, neither the producer nor the verifier, re-scores the records
// the verifier failed.
enum class Ruling {
  kUpheld,      // the arbiter failed one of them too: the producer's quarantine stands
  kOverturned,  // the arbiter checked and passed every one: the verifier is the one suspect
  kUndecided,   // it could not check them all and failed none: nothing changes (an admin decides)
};
Ruling Rule(const std::vector<RecordVerdict>& arbiter_verdicts);
std::string_view RulingName(Ruling ruling);

// The arbitration of `verifier`'s failed verdicts on `spot_check` (its records `failed`, of the
// chunk [chunk_begin, chunk_end)), created at `now`.
VerificationTask ArbitrationOf(const VerificationTask& spot_check, const std::string& verifier,
                               std::vector<int64_t> failed, int64_t chunk_begin, int64_t chunk_end, absl::Time now);

// Whether an executor of owner `arbiter` may judge a dispute between a producer and a verifier of
// these owners (Executor::owner): when they are of one owner, any third executor may; otherwise
// only one of neither's owner, so that no owner judges its own dispute (an owner's second machine
// would release its forger, or uphold its lying verifier, at will).
bool MayArbitrate(const std::string& arbiter, const std::string& producer, const std::string& verifier);

// Whether `producer`'s quarantine is the one `verifier`'s failed verdict on record `custom_id` of
// `job_id` put it in (Quarantine's state_reason): an overturned ruling lifts only that one.
bool QuarantinedBy(const Executor& producer, const std::string& job_id, const std::string& custom_id,
                   const std::string& verifier);

// An overturned ruling quarantines the verifier: its state_reason names the arbiter and the
// record it failed that the arbiter passed. A revoked verifier stays revoked.
void QuarantineOverruled(Executor& verifier, const VerificationTask& arbitration, const std::string& arbiter,
                         const std::string& custom_id);

// A task's records as its row keeps them ("3,17,40"), and back (DataLoss for anything else).
std::string EncodeRecords(const std::vector<int64_t>& records);
absl::StatusOr<std::vector<int64_t>> DecodeRecords(const std::string& text);

// How much of the committed work is re-scored (StoreOptions).
struct VerificationPolicy {
  // The share of a chunk's records drawn (each record on its own, unpredictably to the executor).
  double fraction = 0.02;
  // Every record is drawn while the producer has done fewer records than this (an executor's
  // first tasks): a new executor earns its sampling rate.
  int64_t all_until_records = 100;
  // The most records one verification task carries (a chunk may have more): tasks stay small.
  int64_t max_records = 64;
};

// The policy for a team's jobs: the fleet's, with the team's fraction (Team::verify_fraction)
// when it has one within its bounds (model/identity.h ValidateVerifyFraction; one outside them,
// written past the admin's checks, counts as none: the fleet's).
VerificationPolicy PolicyForTeam(VerificationPolicy fleet, double team_fraction);

// The records of `chunk` to re-score: each drawn with probability policy.fraction (all of them
// while `producer_records_done` < all_until_records), at most max_records, ascending. `uniform`
// answers a number in [0, 1) (the caller's random source).
std::vector<int64_t> DrawRecords(const Chunk& chunk, const VerificationPolicy& policy, int64_t producer_records_done,
                                 const std::function<double()>& uniform);

}  // namespace minions

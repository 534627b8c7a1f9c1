#pragma once
// TaskRun: one attempt at one task as an executor runs it — the executor's core, as plain code.
// It holds the task's records and their output lines, knows which records the runner holds,
// decides when the finished prefix is due as a checkpoint, isolates a record that crashes the
// runner (the task runs alone, its records halved on each crash, a lone record that still
// crashes becomes an error line) and writes the attempt's reports. No threads, no I/O, no clock:
// the agent tells it what happened (results, batch ends, crashes, uploads, and when) and carries
// out what it asks for (run a batch, upload a chunk).
//
// Lifecycle: Start -> NextBatch -> OnResult... -> OnBatchDone (kRunAgain: NextBatch again) ->
// FinalChunk -> ChunkUploaded -> Completion. A crash or a lost runner sends it back to NextBatch.
// Ownership: owns the records, the output lines and the chunk list of the attempt.
// Threads: one thread at a time (the agent's main thread); Progress() copies what the heartbeat
// reports, so the heartbeat thread never touches a TaskRun.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/json_util.h"
#include "model/types.h"

namespace minions {

// "job/index#attempt": the key of one attempt among those an executor holds.
std::string TaskKey(const AttemptRef& ref);

class TaskRun {
 public:
  struct Options {
    // A checkpoint every this many finished records, or this often, whichever comes first.
    int64_t checkpoint_records = 50;
    absl::Duration checkpoint_interval = absl::Seconds(30);
    // Runner crashes one attempt may cause while its records are isolated, before it is given up
    // as a retryable failure (the machine, not a record, is then the suspect).
    int max_crashes = 24;
  };

  // The attempt on `lease`, whose input byte range is `input`. DataLoss when the range does not
  // hold the task's record count; InvalidArgument when the lease resumes outside the task or
  // carries no chunk URL. Either is a permanent failure of the attempt.
  static absl::StatusOr<std::unique_ptr<TaskRun>> Start(LeaseGrant lease, std::string_view input,
                                                        const Options& options, absl::Time now);

  const LeaseGrant& lease() const { return lease_; }
  const AttemptRef& ref() const { return lease_.ref; }
  // "job/index#attempt": unique per attempt, the name of its first runner batch.
  const std::string& key() const { return key_; }

  // --- The runner ---
  struct Batch {
    std::string id;                    // unique per attempt: key(), then key().1, key().2 ...
    std::vector<std::string> records;  // raw input lines
  };
  // What to run next: the next isolation group of a suspect attempt, else every record without
  // an output line. Marks the attempt as in the runner from `now`. nullopt: nothing left to run.
  std::optional<Batch> NextBatch(absl::Time now);
  bool in_runner() const { return in_runner_; }
  // The batch in the runner (or the last one sent).
  const std::string& batch() const { return batch_; }
  // When its last batch was sent to the runner.
  absl::Time started() const { return started_; }
  // The runner died under this attempt once: it runs alone from then on.
  bool suspect() const { return suspect_; }
  // The output line of record `index` of batch `batch`. Another batch's results (an abandoned
  // one), indices outside the batch and repeats of a record's line change nothing.
  void OnResult(std::string_view batch, size_t index, Json output);
  enum class BatchEnd {
    kRunAgain,   // more isolation groups wait: send NextBatch() to the runner, alone
    kFinished,   // every record has a line (those the runner left out say so): FinalChunk()
    kCancelled,  // the runner cancelled the batch
    kYielded,    // stopped for the machine's owner (Yield()): the records left run again later
    kIgnored,    // not this attempt's current batch
  };
  BatchEnd OnBatchDone(std::string_view batch, bool cancelled);
  // The runner died while it held this attempt's batch. `alone`: nothing else was in the runner,
  // so a record of this batch killed it: the unfinished ones are halved into groups that run one
  // after another (a lone record becomes a `runner_crashed` error line). Not alone: the batch runs
  // again, alone. False when the attempt has caused too many crashes and is to be given up.
  bool OnRunnerCrashed(bool alone, std::string_view why);
  // The runner ended for no fault of this attempt (the owner took the machine back, another
  // task's crash is being isolated): its unfinished records run again with the next runner.
  void OnRunnerGone();
  // The machine's owner is back: the agent cancels the batch in the runner, which stops it at its
  // next decode step. Until its batch_done, the `cancelled` error lines the runner writes for the
  // records it had not finished are no answers (they are not kept); the records it did finish
  // are. OnBatchDone then says kYielded (or kFinished, when the batch ended first), and the
  // records left run again in the next batch (NextBatch), on the same runner.
  void Yield();
  bool yielding() const { return yielding_; }
  // Its batch ended for the owner and no new one has been sent since.
  bool yielded() const { return yielded_; }

  // --- Checkpoints ---
  struct ChunkUpload {
    Chunk chunk;           // what a heartbeat commits once both objects are written
    ChunkUrls urls;        // where they go
    std::string output;    // output lines, in record order; written even when empty
    std::string errors;    // error lines; not written when empty
  };
  // The finished prefix beyond the last chunk, when a checkpoint is due at `now`
  // (checkpoint_records of them, or checkpoint_interval since the last one; any, with `now_anyway`:
  // the owner took the machine back, and a stop may follow). The last URL pair is kept for the
  // final chunk; a prefix that reaches the end waits for it too.
  std::optional<ChunkUpload> DueCheckpoint(absl::Time now, bool now_anyway = false);
  // The attempt's last chunk: every record after the last chunk (after OnBatchDone said
  // kFinished, or when NextBatch had nothing to run). nullopt when every record is in a chunk
  // already (one of this attempt's, or a committed one it resumed after: an attempt that resumes
  // at its end completes without a chunk). Internal when a record has no line, FailedPrecondition
  // when no URL is left.
  absl::StatusOr<std::optional<ChunkUpload>> FinalChunk();
  // Both objects of `chunk` are written: the heartbeat may commit it.
  void ChunkUploaded(const Chunk& chunk, absl::Time now);
  // Every record has a line and every line is in an uploaded chunk (or a committed one it resumed after).
  bool uploaded() const;

  // --- Reports ---
  // The attempt's progress, for heartbeats and failure reports: records done (counting those it
  // resumed after), error lines among them, the chunks uploaded so far.
  LeaseProgress Progress() const;
  // The completion report: every record done; the failures are the chunks' error lines.
  LeaseProgress Completion() const;
  // Changes with every change to Progress(): republish a snapshot when it moved.
  uint64_t version() const { return version_; }

  // The server took the attempt back (job cancelled, lease given to another): nothing of it is
  // reported any more.
  void Cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  int crashes() const { return crashes_; }
  int64_t records_done() const { return records_done_; }
  int64_t records_failed() const { return records_failed_; }

 private:
  TaskRun(LeaseGrant lease, std::vector<std::string> records, const Options& options, absl::Time now);
  // Gives record `i` its line (the first one counts).
  void SetOutput(size_t i, Json line);
  // Records of the current batch without a line, in record order.
  std::vector<size_t> UnfinishedInBatch() const;
  // Records [from, to) as a chunk to upload as this attempt's next.
  ChunkUpload MakeChunk(int64_t from, int64_t to) const;

  const Options options_;
  const LeaseGrant lease_;
  const std::string key_;
  const std::vector<std::string> records_;  // every record of the task
  std::vector<std::optional<Json>> outputs_;
  int64_t records_done_ = 0;                // lines given by this attempt
  int64_t records_failed_ = 0;              // error lines among them
  uint64_t version_ = 0;

  // The runner.
  bool in_runner_ = false;
  absl::Time started_;
  std::string batch_;                       // the batch in the runner (or the last one)
  std::vector<size_t> batch_records_;       // its records: runner index -> record index
  int batches_ = 0;                         // batches sent, for unique ids
  bool suspect_ = false;
  bool yielding_ = false;                   // Yield(): the batch in the runner is being cancelled
  bool yielded_ = false;                    // ... and ended so (kYielded), not sent again yet
  std::deque<std::vector<size_t>> isolation_;  // groups still to run alone, in order
  int crashes_ = 0;

  // Checkpoints.
  std::vector<Chunk> chunks_;               // uploaded, in order
  int64_t chunk_begin_ = 0;                 // first record not in an uploaded chunk
  int64_t prefix_end_ = 0;                  // records [0, prefix_end_) all have a line
  absl::Time last_chunk_at_;

  bool cancelled_ = false;
};

}  // namespace minions

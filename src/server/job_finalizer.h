#pragma once
// JobFinalizer: turns a finished job's task outputs into its results: one output file and one
// error file, both in input order, and a manifest naming the attempt each task's lines came from.
// A task that failed for good contributes an error line per record ("task_failed"), so every
// custom_id appears exactly once across the two files. Every chunk is checked as it is merged
// (server/chunk_check.h); one that fails is not published and its records get error lines.
//
// Several servers may finalise the same job at once: each writes its results under keys of its own
// (server/keys.h), the store's FinishJob lets exactly one win and names the winner's keys in the
// job's row, and a loser removes its own objects. A published result object is never written again.
// Threads: FinalizeReady may be called from several threads.

#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "blob/blob_store.h"
#include "common/clock.h"
#include "server/chunk_check.h"
#include "store/metadata_store.h"

namespace minions {

class JobFinalizer {
 public:
  // `verify_wait`: ServerOptions::verify_wait.
  JobFinalizer(MetadataStore* store, BlobStore* blobs, Clock* clock, ChunkCheckOptions chunk_limits = {},
               absl::Duration verify_wait = absl::Minutes(10))
      : store_(store), blobs_(blobs), clock_(clock), chunk_limits_(chunk_limits), verify_wait_(verify_wait) {}

  // Finalises one job in `finalizing` whose spot checks all have their verdicts (one still open
  // leaves it finalizing, until `verify_wait` after its last task ended: then it publishes, the
  // checks still open counted in its manifest and left open, so a later verdict still counts);
  // returns the job as it is afterwards.
  absl::StatusOr<Job> Finalize(const std::string& job_id);
  // Finalises every job waiting for it; returns how many were finished.
  absl::StatusOr<int> FinalizeReady();
  // A cancelled job's partial results: what its tasks committed before the cancel, merged as
  // Finalize would (keys::CancelledJobOutput and CancelledJobErrors; an error line "batch_cancelled" for every
  // record that never ran). The job's row is left as it is. Idempotent (the same bytes each time:
  // a cancelled job's tasks commit nothing more). Returns the tokens the merged output lines state
  // they used (as Finalize keeps in Job::tokens; the caller keeps them where it needs them).
  absl::StatusOr<TokenUsage> MergeCancelled(const std::string& job_id);
  // Where a cancelled job's results lie (output and errors keys), merged by MergeCancelled first
  // unless a merge has ended before (its error file, written last, exists). Any reader of a
  // cancelled job's results comes through here (the CLI's results, the OpenAI API's files), so
  // they read the same bytes. FailedPrecondition for a job that is not cancelled.
  struct ResultKeys {
    std::string output;
    std::string errors;
  };
  absl::StatusOr<ResultKeys> CancelledResults(const std::string& job_id);
  // Where the results of `job` lie, for every reader (the CLI's results, the dashboard's
  // download): a completed or expired job's row names them; a cancelled job's are
  // CancelledResults. FailedPrecondition, saying when results exist, for any other job.
  absl::StatusOr<ResultKeys> ResultsOf(const Job& job);

 private:
  // Adds the sizes of `objects` to the team's result bytes (Team::result_bytes).
  void ChargeResults(const std::string& team, std::initializer_list<std::string> objects);
  // Writes the merged output and error files of `job` (see Finalize) to `output_key` and
  // `errors_key`; `cancelled`: unfinished records were cancelled, not expired. Chunks that failed
  // their check are added to `rejected`; the tokens the published output lines state, to `tokens`.
  absl::Status WriteResults(const Job& job, const std::vector<Task>& tasks, bool cancelled,
                            const std::string& output_key, const std::string& errors_key,
                            std::map<std::pair<int64_t, int>, std::string>* rejected, TokenUsage* tokens);

  MetadataStore* store_;
  BlobStore* blobs_;
  Clock* clock_;
  ChunkCheckOptions chunk_limits_;
  absl::Duration verify_wait_;
};

}  // namespace minions

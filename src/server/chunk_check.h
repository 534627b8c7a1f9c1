#pragma once
// ChunkCheck: what the server makes sure of before an executor's upload becomes part of a job's
// results. An executor is trusted only with the tasks it leased (docs/architecture.md, "Executors
// trust nothing; the server trusts no executor"): the chunk it reports must hold exactly one line
// per record of its claimed range, each answering that record's custom_id, successes in its
// output object and errors in its error object (as many as it claims), each object within a size
// limit. Anything else is a forged (or broken) chunk.
//
// Two places check (the same VerifyChunk):
// - the commit path: ChunkChecker stands in front of the store's calls that commit chunks
//   (heartbeats, completions, failures). A chunk that fails fails its attempt (retryable): the
//   task goes back to pending and the next attempt, elsewhere, resumes after the last good chunk;
//   the bad chunk is never committed. Nothing is lost but the bad executor's work.
// - the finaliser (job_finalizer.cc) checks every committed chunk again as it merges it, because
//   a presigned upload URL stays valid after the commit: a chunk rewritten after it was checked
//   is not published; its records get "output_rejected" error lines instead.
//
// Threads: VerifyChunk is pure; ChunkChecker is thread-safe.

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "blob/blob_store.h"
#include "model/types.h"
#include "server/heartbeat_batcher.h"
#include "server/job_spec_cache.h"
#include "server/server_metrics.h"
#include "store/metadata_store.h"

namespace minions {

// Error code of the lines the finaliser writes for a chunk it refuses to publish.
inline constexpr std::string_view kErrorOutputRejected = "output_rejected";

struct ChunkCheckOptions {
  // The largest output (or error) object of one chunk; the finaliser holds one in memory.
  int64_t max_chunk_bytes = int64_t{256} << 20;
};

// The custom_ids an executor's lines must answer: ParseRecordLine's custom_id of each record
// ("" for a line that has none).
std::vector<std::string> ExpectedCustomIds(const std::vector<std::string>& records, int64_t begin, int64_t end);

// Checks one chunk's objects (`output`, `errors`: their bytes; "" for a missing error object)
// against `expected_ids`, the custom_ids of its records [chunk.begin, chunk.end) in order.
// InvalidArgument saying what is wrong (which line, which record) when it does not hold.
// `tokens` (may be null): a chunk that passes adds what its output lines' response.body.usage
// state (prompt_tokens, completion_tokens) to it; the executor's word, as the lines themselves are.
absl::Status VerifyChunk(const Chunk& chunk, std::string_view output, std::string_view errors,
                         const std::vector<std::string>& expected_ids, TokenUsage* tokens = nullptr);

// One of a chunk's objects, read with its size checked as it comes: InvalidArgument past `limit`
// bytes (an object that grows after being measured cannot slip by), NotFound when missing.
absl::StatusOr<std::string> ReadChunkObject(BlobStore& blobs, const std::string& key, int64_t limit);

// The store's chunk-committing calls, each admitting only chunks that pass VerifyChunk. Same
// signatures and answers as MetadataStore's, plus: a report whose new chunk fails is refused
// (its attempt failed, retryable, keeping the good chunks before it); a report whose chunks cannot
// be read just now (the object store is away) is not refused, only not committed (heartbeats) or
// answered Unavailable (completions: the executor tries again).
class ChunkChecker {
 public:
  // `heartbeats` (may be null: one transaction per heartbeat) commits the heartbeats it admits.
  // `metrics` (may be null) counts the tokens of the chunks admitted (ServerMetrics::TokensAdmitted).
  ChunkChecker(MetadataStore* store, BlobStore* blobs, ChunkCheckOptions options = {},
               HeartbeatBatcher* heartbeats = nullptr, ServerMetrics* metrics = nullptr)
      : store_(store), blobs_(blobs), options_(options), heartbeats_(heartbeats), metrics_(metrics), specs_(store) {}

  absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& executor_id, ExecutorState state,
                                           const std::string& reason, const std::vector<LeaseProgress>& held,
                                           absl::Duration ttl, absl::Time now,
                                           const std::optional<ModelHoldings>& holdings = std::nullopt);
  // The same without waiting for the store: the chunks are checked on this thread, and `answer`
  // gets the reply when the heartbeat batch commits (on the batcher's thread; with no batcher, on
  // this one before this returns).
  void HeartbeatAsync(const std::string& executor_id, ExecutorState state, const std::string& reason,
                      const std::vector<LeaseProgress>& held, absl::Duration ttl, absl::Time now,
                      const std::optional<ModelHoldings>& holdings, HeartbeatBatcher::Answer answer);
  absl::StatusOr<std::vector<absl::Status>> CompleteTasks(const std::string& executor_id,
                                                          const std::vector<LeaseProgress>& reports, absl::Time now);
  // Several executors' completions (MetadataStore::CompleteMany): their tasks are read in one go
  // to screen the reports' chunks, and the admitted reports commit in one transaction. A call
  // whose chunks cannot be read just now is answered Unavailable (nothing of it committed), the
  // others go on; an error of the store fails the whole batch. The calls are screened by up to
  // kScreeners threads at once (each call's reports in order).
  absl::StatusOr<CompletionReply> CompleteMany(const std::vector<CompletionCall>& calls, absl::Time now);
  absl::StatusOr<Task> FailTask(const std::string& executor_id, const std::string& job_id, int64_t task_index,
                                int attempt, FailureClass failure, const std::string& message, absl::Time now,
                                const std::vector<Chunk>& chunks = {});

  // The specs of the jobs whose chunks it checks, for whoever else needs them (one cache a server).
  JobSpecCache& job_specs() { return specs_; }

  // Chunks refused so far (for metrics and tests).
  int64_t rejected() const {
    absl::MutexLock lock(&mu_);
    return rejected_;
  }

 private:
  enum class Verdict { kAdmit, kRejected, kUnreadable };
  // Most threads that screen one batch of completions at once (CompleteMany).
  static constexpr size_t kScreeners = 8;
  // Checks the chunks `report` would commit (the model's transition applied to a copy of the task
  // says which: those of `report.chunks` not yet committed, plus the implicit last chunk of a
  // completion). kRejected: the attempt has been failed and `why` says why. `good` (when not
  // null) receives the reported chunks that passed, in order, up to the first that did not.
  // `read` (when not null) is the report's task as already read (NotFound: none), else it is read.
  Verdict Screen(const std::string& executor_id, const LeaseProgress& report, bool completing, absl::Time now,
                 absl::Status* why, std::vector<Chunk>* good, const absl::StatusOr<Task>* read = nullptr);
  absl::Status CheckOne(const Task& task, const std::string& input_key, const Chunk& chunk,
                        std::vector<std::string>* records, TokenUsage* tokens);
  bool Known(const std::string& key);
  // Whether this call admitted `key` (false: admitted before, or by another screen meanwhile).
  bool Remember(const std::string& key);

  MetadataStore* store_;
  BlobStore* blobs_;
  ChunkCheckOptions options_;
  HeartbeatBatcher* heartbeats_;
  ServerMetrics* metrics_;
  JobSpecCache specs_;  // the jobs' inputs (and whatever else a server reads of a job's spec)
  mutable absl::Mutex mu_;
  // Chunks this server checked and admitted ("job/task#attempt.seq"): an executor lists its
  // attempt's chunks in every heartbeat, and they are not read again. Bounded, oldest forgotten.
  absl::flat_hash_set<std::string> admitted_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> admitted_order_ ABSL_GUARDED_BY(mu_);
  int64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace minions

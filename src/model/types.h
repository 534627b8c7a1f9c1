#pragma once
// The domain's records: jobs, tasks, executors. Plain data, no I/O. Times are absl::Time; durations
// absl::Duration. Ids are strings ("job-…", "exe-…"); a task is (job id, index).

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/json_util.h"

namespace minions {

enum class JobState { kValidating, kQueued, kRunning, kFinalizing, kCompleted, kFailed, kCancelled, kExpired };
enum class TaskState { kPending, kRunning, kSucceeded, kFailed, kCancelled };
// kRevoked: cut off by an admin (IdentityStore::RevokeExecutor); final.
// kQuarantined: an answer it gave failed verification (model/verification.h); no leases until an
// admin releases it (MetadataStore::ReleaseExecutor).
// kPending: enrolled where the server requires approval; no leases, and nothing it says or
// re-registers lifts it, until an admin approves it (IdentityStore::ApproveExecutor).
enum class ExecutorState { kAvailable, kBusy, kOwnerActive, kDraining, kLost, kRevoked, kQuarantined, kPending };
// Why an attempt ended without success.
enum class FailureClass { kRetryable, kPermanent, kPreempted };

std::string_view JobStateName(JobState state);
std::string_view TaskStateName(TaskState state);
std::string_view ExecutorStateName(ExecutorState state);
// What people are shown of an executor's state: its owner's presence (owner_active) becomes
// "unavailable", so nothing says why a machine is not free.
std::string_view ExecutorStateShown(ExecutorState state);
std::string_view FailureClassName(FailureClass failure);
std::optional<JobState> ParseJobState(std::string_view name);
std::optional<TaskState> ParseTaskState(std::string_view name);
std::optional<ExecutorState> ParseExecutorState(std::string_view name);
std::optional<FailureClass> ParseFailureClass(std::string_view name);

bool IsTerminal(JobState state);
bool IsTerminal(TaskState state);

// What a job asks of an executor.
struct Requirements {
  // The executor's usable memory (ExecutorInfo::usable_memory_bytes) must be at least this: the
  // larger of the submitter's floor and estimate_bytes. The lease query filters on this one number.
  int64_t min_memory_bytes = 0;
  // What one task of the job needs (model/memory_estimate.h EstimateTaskMemory of the job's model
  // and runner options); 0 when unknown (a model named by path).
  int64_t estimate_bytes = 0;
  std::string runner = "llama";  // which runner program serves it (an executor's declared runners)
  // Only executors whose runners are fully confined (ExecutorInfo::confinement == kConfinementFull)
  // may run it: asked for by the submitter, or by its team (Team::require_confined); docs/security.md 40.6a.
  bool confined = false;
};

// What the submitter asks for.
// The largest input one job takes inline (ServerOptions::max_input_bytes, which no flag changes):
// the CLI checks a file against it before it reads it (cli/client_verbs.cc).
inline constexpr int64_t kDefaultMaxInputBytes = int64_t{256} << 20;
// The largest input sent inside SubmitJobRequest; a larger one travels as a stream of parts of at
// most kInputPartBytes (Jobs.UploadInput), as `minions submit` does, so that no gRPC message a
// server takes is larger than a few MiB (ServerOptions::max_message_bytes; docs/security.md 40.2d).
inline constexpr int64_t kMaxInlineInputBytes = int64_t{1} << 20;
inline constexpr int64_t kInputPartBytes = int64_t{1} << 20;

struct JobSpec {
  std::string team = "default";   // owner team, for fair share and accounting
  std::string owner;              // who submitted it: its credential's principal ("" before identities)
  // The model: a registry name (ModelRecord::name of the job's team), or a GGUF path on executors
  // (a loopback pool, or a folder the executors allow) when model_digest is empty.
  std::string model;
  std::string model_digest;       // "sha256:<64 hex>" of a registry model; "" for a path
  int64_t model_size_bytes = 0;   // the registry model's size (what an executor downloads)
  std::string input_key;          // the input JSONL in the object store
  int64_t shard_size = 100;       // records per task
  int max_attempts = 4;           // real failures (not preemptions) before a task fails
  int priority = 0;               // higher first
  Requirements requirements;
  Json runner_options = Json::object();  // the runner's load options (runner_protocol::LoadOptions)
  std::optional<absl::Duration> completion_window;  // deadline after submission (issue: deadlines)
  // A gang job (docs/architecture.md, "Gangs"): each task runs on exactly this many executors at
  // once, a leader and members lending it their memory (requirements.min_memory_bytes is then what
  // the whole gang needs). 0: one executor per task.
  int gang_size = 0;
  // The answer tokens a record of the input asks for, on average over its first records (their
  // max_tokens, else the endpoint's default); 0: not known. Task sizes are measured and chosen per
  // its power-of-two bucket (model/task_sizing.h): a job of 64-token answers is not sized from a
  // job of 8-token ones.
  int64_t tokens_per_record = 0;
  std::string sizing;  // how the server chose shard_size ("" when the submitter asked for it)
};

struct RequestCounts {
  int64_t total = 0;
  int64_t completed = 0;
  int64_t failed = 0;
};

// Tokens a job's answers say they used: the sums of their lines' response.body.usage, added up by
// the finaliser over the lines it publishes (server/chunk_check.h). The executors' word: a
// figure to report (the OpenAI batch object's usage), not one to bill by.
struct TokenUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // Of completion_tokens, those of reasoning (usage.completion_tokens_details.reasoning_tokens,
  // stated by lines whose model's template reasons); 0 for a job finished before schema 19.
  int64_t reasoning_tokens = 0;
  bool operator==(const TokenUsage&) const = default;
  // Adds `other` (non-negative counts), each sum held at the largest int64 rather than overflowing.
  void Add(const TokenUsage& other) {
    prompt_tokens = Saturated(prompt_tokens, other.prompt_tokens);
    completion_tokens = Saturated(completion_tokens, other.completion_tokens);
    reasoning_tokens = Saturated(reasoning_tokens, other.reasoning_tokens);
  }
  int64_t total() const { return Saturated(prompt_tokens, completion_tokens); }

 private:
  static int64_t Saturated(int64_t a, int64_t b) {
    return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
  }
};

struct Job {
  std::string id;
  JobSpec spec;
  JobState state = JobState::kValidating;
  RequestCounts counts;
  int64_t n_tasks = 0;
  int64_t tasks_done = 0;   // tasks in a terminal state
  int64_t tasks_succeeded = 0;
  std::string error;        // why the job failed (validation, all tasks failed, ...)
  std::string output_key;   // merged output, set when completed
  std::string errors_key;   // merged error lines
  std::string manifest_key;
  absl::Time created_at;
  absl::Time updated_at;
  std::optional<absl::Time> started_at;   // first lease
  std::optional<absl::Time> finished_at;
  // Every ended attempt's device time (accounting: what the job cost), charged by the store as
  // attempts end, as its team's is; read with the job, never written back with it.
  absl::Duration device_time;
  // Set when the job finishes (FinishJob); none before, for a job that ends otherwise (failed,
  // cancelled), and for one finished before schema 14 or by a server of an earlier release (they
  // did not count). Read with the job, written only by FinishJob.
  std::optional<TokenUsage> tokens;
};

// A checkpoint of a task: the output of records [begin, end) (task-relative), written by one attempt
// as that attempt's chunk number `seq` (keys::ChunkOutput). A task's committed chunks are contiguous
// from record 0; they survive failures, so the next attempt resumes after them.
struct Chunk {
  int attempt = 0;
  int seq = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t records_failed = 0;
  // The executor whose attempt uploaded it (its producer, whose answers verification re-scores),
  // set when the store commits it; "" in rows committed before it was kept.
  std::string executor_id;
  bool operator==(const Chunk&) const = default;
};

// One shard of a job: records [first_record, first_record + n_records), bytes [byte_begin, byte_end)
// of the input, newline-aligned.
struct Task {
  std::string job_id;
  int64_t index = 0;
  int64_t first_record = 0;
  int64_t n_records = 0;
  int64_t byte_begin = 0;
  int64_t byte_end = 0;
  TaskState state = TaskState::kPending;
  int attempt = 0;              // bumped on every lease: the fencing token
  int failures = 0;             // real failures (counted against max_attempts)
  int preemptions = 0;          // owner came back: never counted
  std::string executor_id;      // holder of the current lease
  std::optional<absl::Time> lease_expires_at;
  std::optional<absl::Time> not_before;  // retry backoff
  int64_t records_done = 0;     // progress of the current attempt (at least the committed records)
  int64_t records_failed = 0;   // error lines among them
  std::vector<Chunk> chunks;    // committed checkpoints, contiguous from record 0
  // A straggler's attempt, still running while a backup attempt (the task's current one) races
  // it; whichever completes first wins (model RequestBackup). It holds no lease of its own.
  struct Shadow {
    int attempt = 0;
    std::string executor_id;
    // When it became a shadow (the backup was requested). Its time before was charged then, as an
    // attempt that ended; the time after is charged only if it wins (store_rules EndedAttemptTime).
    // Unset in rows written before it was kept.
    std::optional<absl::Time> since;
    bool operator==(const Shadow&) const = default;
  };
  std::optional<Shadow> shadow;
  std::string last_error;
  std::optional<absl::Time> started_at;   // of the current attempt
  std::optional<absl::Time> finished_at;
};

// The kinds of accelerator an executor reports (ExecutorInfo::accelerator).
inline constexpr char kAcceleratorCpu[] = "cpu";
inline constexpr char kAcceleratorMetal[] = "metal";
inline constexpr char kAcceleratorCuda[] = "cuda";

// What an executor holds of the models, reported at registration and in every heartbeat.
struct ModelHoldings {
  std::vector<std::string> cached;  // digests ("sha256:…") in its model cache, verified
  std::string loaded;               // digest (or path) its runner has loaded now; "" when none
  bool operator==(const ModelHoldings&) const = default;
};

struct ExecutorInfo {
  std::string name;          // host name or a label
  std::string os;            // "linux", "macos"
  std::string chip;          // CPU or SoC model
  int64_t memory_bytes = 0;  // physical memory of the machine
  std::string accelerator = kAcceleratorCpu;  // kAccelerator*: what runs the model
  std::string gpu;           // the accelerator's device name; "" when none (CPU)
  // Memory a task may use on this machine under its owner's limits: for a GPU its memory (Metal:
  // the recommended working set), for the CPU the machine's memory, capped by the owner's
  // setting. 0 from an executor that does not say (older): placement falls back to memory_bytes.
  int64_t usable_memory_bytes = 0;
  std::vector<std::string> runners;  // runner names it can start ("llama", custom ones it declares)
  // What it holds of the models (ModelHoldings; updated by every heartbeat that reports them).
  std::vector<std::string> models;   // digests in its model cache
  std::string model_loaded;          // digest (or path) its runner has loaded; "" when none
  int max_tasks = 1;         // tasks it runs at once
  std::string version;
  // Its gang member gate on the network the operator names for gangs ("host:port"; config
  // [gang] address): leaders reach its rpc-server there. "" : it joins no gang.
  std::string gang_address;
  // The folders a job may name a model file in (its owner's `--models`, as configured and as real
  // paths): the server refuses at submit a model path under none of the fleet's. Empty from an
  // executor that does not say (older): nothing is checked against it.
  std::vector<std::string> model_folders;
  // How its runners are confined: kConfinement* ("" from an executor that does not say: unknown,
  // which counts as not confined).
  std::string confinement;
};

// ExecutorInfo::confinement: Landlock and seccomp (macOS: sandbox-exec); seccomp only (a kernel
// without Landlock); nothing (the owner turned the sandbox off).
inline constexpr char kConfinementFull[] = "full";
inline constexpr char kConfinementPartial[] = "partial";
inline constexpr char kConfinementNone[] = "none";

// What placement compares a job's Requirements::min_memory_bytes with.
inline int64_t UsableMemory(const ExecutorInfo& info) {
  return info.usable_memory_bytes > 0 ? info.usable_memory_bytes : info.memory_bytes;
}

// What a GGUF file's header says that placement and people need (model/gguf_header.h reads it).
// 0 or "" when the header does not say.
struct ModelFacts {
  std::string format = "gguf";
  std::string architecture;     // general.architecture: "llama", "qwen2", "bert", ...
  std::string name;             // general.name
  int64_t parameters = 0;       // weights counted over the tensors
  std::string quantization;     // general.file_type as llama.cpp names it ("Q4_K_M", "F16")
  int64_t context_length = 0;   // training context (ARCH.context_length)
  int64_t layers = 0;           // ARCH.block_count
  int64_t embedding_size = 0;   // ARCH.embedding_length
  int64_t heads = 0;            // ARCH.attention.head_count
  int64_t kv_heads = 0;         // ARCH.attention.head_count_kv (heads when absent)
  int64_t head_dim = 0;         // ARCH.attention.key_length, else embedding_size / heads
  int64_t vocab_size = 0;       // tokenizer.ggml.tokens
  bool operator==(const ModelFacts&) const = default;
};

// A model in the registry: a name of a team, bound to bytes by their digest. Several digests may
// carry one name (each push of new bytes adds one); the name alone means the newest.
struct ModelRecord {
  std::string team;
  std::string name;
  std::string digest;           // "sha256:<64 lowercase hex>"
  int64_t size_bytes = 0;
  ModelFacts facts;
  std::string blob_key;         // where the bytes are (server keys::ModelBlob(team, digest))
  std::string created_by;       // the pushing principal
  absl::Time created_at;
};

struct Executor {
  std::string id;
  ExecutorInfo info;
  ExecutorState state = ExecutorState::kAvailable;
  std::string state_reason;     // why (owner present, draining, ...)
  absl::Time registered_at;
  absl::Time last_heartbeat_at;
  bool drain_requested = false;
  int64_t records_done = 0;     // lifetime, for dashboards
  // Who owns the machine, as the server knows it (never what the executor says): the name of the
  // join token it enrolled with (model/identity.h ExecutorOwner); "" when it did not enrol. A
  // spot check goes to another owner's executor first (docs/verification.md).
  std::string owner;
};

// Records [0, n) of the task are committed in chunks.
inline int64_t CommittedRecords(const Task& task) { return task.chunks.empty() ? 0 : task.chunks.back().end; }
int64_t CommittedFailed(const Task& task);

// One executor's place in a gang (store/gang_store.h GangLease): seat 0 leads.
struct GangSeat {
  std::string executor_id;
  std::string endpoint;  // the member's rpc gate on the gang network (host:port); the leader's own gang address
  int64_t bytes = 0;     // memory it lends the gang
  bool operator==(const GangSeat&) const = default;
};

// A granted lease: everything an executor needs to run one attempt.
struct Lease {
  Task task;
  std::string job_model;
  std::string team;             // the job's team (whose model bytes these are)
  std::string model_digest;     // the job's registry model ("" for a path)
  int64_t model_size_bytes = 0;
  std::string runner;           // the job's runner
  Json runner_options;
  std::string input_key;
  absl::Time expires_at;
  std::vector<GangSeat> gang;   // a gang task: its seats, the leader (this lease's holder) first
  // A gang task: the secret the server minted for this attempt (GangLeasing::Form; never stored),
  // which the leader proves to each member's gate (executor/gang_handshake.h).
  std::string gang_secret;
};
// A granted task (its lease held) and its job make a lease.
Lease MakeLease(Task task, const JobSpec& spec);


// Progress an executor reports for a lease it holds.
struct LeaseProgress {
  std::string job_id;
  int64_t task_index = 0;
  int attempt = 0;
  int64_t records_done = 0;
  int64_t records_failed = 0;
  std::vector<Chunk> chunks;  // chunks the attempt has uploaded (see CommitChunks)
};

// One attempt at one task: the fencing token every report about it carries.
struct AttemptRef {
  std::string job_id;
  int64_t task_index = 0;
  int attempt = 0;
  bool operator==(const AttemptRef&) const = default;
};
// "job=J task=T attempt=A", as every log line about an attempt says it.
std::string Describe(const AttemptRef& ref);

// Where one chunk of an attempt is written: output lines to one URL, error lines to the other.
struct ChunkUrls {
  std::string output_url;
  std::string errors_url;
};

// A lease as the executor holding it sees it: one attempt at one task, what to run it with, and
// the URLs it reads and writes (it holds no object-store credentials). The server's own view is
// Lease.
struct LeaseGrant {
  AttemptRef ref;
  int64_t first_record = 0;   // the task's first record in the job's input
  int64_t n_records = 0;
  std::string input_url;      // read bytes [byte_begin, byte_end): the task's records
  int64_t byte_begin = 0;
  int64_t byte_end = 0;
  std::string model;          // what the runner loads: a path, or the registry name (see model_digest)
  // A registry model: its digest, size and a URL to download it from when not cached (the
  // executor verifies the digest before it loads anything). Empty/0 for a model named by path.
  std::string model_digest;
  int64_t model_size_bytes = 0;
  std::string model_url;
  std::string runner;         // which runner program serves it
  std::string runner_options_json;  // the runner's load options ("" or a JSON object)
  absl::Time expires_at;
  int64_t resume_from = 0;    // records [0, resume_from) were committed by earlier attempts
  // Chunk number k of this attempt goes to chunk_urls[k]; the last pair must take everything up
  // to the end of the task.
  std::vector<ChunkUrls> chunk_urls;
  // A gang task (this executor leads): its members' rpc gates and the memory each lends, and what
  // this machine lends (docs/architecture.md, "Gangs"). Empty: the model runs here alone.
  struct GangPeer {
    std::string endpoint;
    int64_t bytes = 0;
    bool operator==(const GangPeer&) const = default;
  };
  std::vector<GangPeer> gang;
  int64_t gang_leader_bytes = 0;
  std::string gang_secret;  // what its members' gates ask it to prove (executor/gang_handshake.h)
};

// A member's part in a gang (docs/architecture.md, "Gangs"): serve the leader's rpc connections
// for this attempt until the server says it ended.
struct GangDuty {
  AttemptRef ref;
  std::string leader_host;  // the only address the member's gate admits
  std::string bind;         // this member's gate (its gang address, host:port)
  std::string secret;       // this attempt's gang secret: the gate admits only who proves it
  bool operator==(const GangDuty&) const = default;
};

// What the server tells an executor in answer to a heartbeat.
struct HeartbeatReply {
  std::vector<LeaseProgress> cancel;  // leases the executor must stop (cancelled, or not its own)
  std::vector<LeaseProgress> renewed;
  bool drain = false;
  bool unknown_executor = false;      // register again
};

}  // namespace minions

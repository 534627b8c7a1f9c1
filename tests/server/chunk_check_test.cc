#include "server/chunk_check.h"

#include <thread>

#include "blob/local/local_blob_store.h"
#include "runner/batch_record.h"
#include "metrics/metrics.h"
#include "server/keys.h"
#include "server/job_splitter.h"
#include "server/server_metrics.h"
#include "server_test_util.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"
#include "testing/prometheus_text.h"

namespace minions::testing {
namespace {

std::string Ok(const std::string& id) { return DumpJson(MakeResponseLine(id, Json{{"text", "t"}})) + "\n"; }
std::string Err(const std::string& id) { return DumpJson(MakeErrorLine(id, "invalid_request", "bad")) + "\n"; }

TEST(VerifyChunk, AnHonestChunkPasses) {
  Chunk chunk{1, 0, 0, 4, 1};
  EXPECT_OK(VerifyChunk(chunk, Ok("a") + Ok("b") + Ok("d"), Err("c"), {"a", "b", "c", "d"}));
  // Blank lines and a missing final newline change nothing.
  std::string out = Ok("a") + "\n  \n" + Ok("b") + Ok("d");
  out.pop_back();
  EXPECT_OK(VerifyChunk(chunk, out, Err("c"), {"a", "b", "c", "d"}));
}

// A refused request is a 400 response with error null (OpenAI's batch output): an error line,
// whose place is the error file; the old error object is one too.
TEST(VerifyChunk, A400ResponseIsAnErrorLine) {
  Chunk chunk{1, 0, 0, 2, 1};
  const std::string refused = Err("b");
  ASSERT_THAT(refused, HasSubstr(R"("status_code":400)"));
  EXPECT_OK(VerifyChunk(chunk, Ok("a"), refused, {"a", "b"}));
  auto misplaced = VerifyChunk(Chunk{1, 0, 0, 2, 0}, Ok("a") + refused, "", {"a", "b"});
  ASSERT_FALSE(misplaced.ok());
  EXPECT_THAT(std::string(misplaced.message()), HasSubstr("is an error line"));
  const std::string cancelled = DumpJson(MakeErrorLine("b", kErrorCancelled, "cancelled")) + "\n";
  EXPECT_OK(VerifyChunk(chunk, Ok("a"), cancelled, {"a", "b"}));
}

// The tokens a chunk's output lines state (response.body.usage) are added up; only there, only
// whole non-negative numbers, each capped; error lines add nothing; a chunk that fails adds nothing.
TEST(VerifyChunk, APassingChunkAddsTheTokensItsOutputLinesState) {
  auto line = [](const std::string& id, const std::string& response) {
    return absl::StrCat(R"({"custom_id":")", id, R"(","response":)", response, R"(,"error":null})", "\n");
  };
  const std::string output =
      line("a", R"({"body":{"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}})") +
      // a duplicate key: the later value wins, as a JSON parser reads it, also when it holds no
      // count (a duplicate count that is not a number, or a duplicate usage, body or response)
      line("b", R"({"body":{"usage":{"prompt_tokens":1,"prompt_tokens":2,"completion_tokens":5}}})") +
      line("b2", R"({"body":{"usage":{"prompt_tokens":700,"prompt_tokens":"x","completion_tokens":700},)"
                 R"("usage":{"prompt_tokens":0}}})") +
      line("b3", R"({"body":{"usage":{"prompt_tokens":800,"completion_tokens":800}},"body":{}})") +
      absl::StrCat(R"({"custom_id":"b4","response":{"body":{"usage":{"completion_tokens":900}}},)",
                   R"("response":{"status_code":200},"error":null})", "\n") +
      // not counts: negative, fractional, a string, a huge number (capped)
      line("c", R"({"body":{"usage":{"prompt_tokens":-4,"completion_tokens":1.5}}})") +
      line("d", R"({"body":{"usage":{"prompt_tokens":"9","completion_tokens":9999999999999}}})") +
      // in the wrong places: usage outside the body, in an array, a body's nested object
      line("e", R"({"usage":{"prompt_tokens":1000},"body":{"x":{"usage":{"prompt_tokens":1000}}}})") +
      line("f", R"({"body":{"usage":[{"prompt_tokens":1000}],"choices":[{"usage":{"completion_tokens":1000}}]}})");
  const std::string errors = absl::StrCat(
      R"({"custom_id":"g","response":{"body":{"usage":{"prompt_tokens":500}}},"error":{"code":"x"}})", "\n");
  const std::vector<std::string> ids = {"a", "b", "b2", "b3", "b4", "c", "d", "e", "f", "g"};
  TokenUsage tokens{.prompt_tokens = 1, .completion_tokens = 1};  // added to
  ASSERT_OK(VerifyChunk(Chunk{1, 0, 0, 10, 1}, output, errors, ids, &tokens));
  EXPECT_EQ(tokens.prompt_tokens, 1 + 7 + 2);
  EXPECT_EQ(tokens.completion_tokens, 1 + 3 + 5 + (int64_t{1} << 32));
  TokenUsage refused;
  std::vector<std::string> wrong = ids;
  wrong.back() = "h";
  EXPECT_FALSE(VerifyChunk(Chunk{1, 0, 0, 10, 1}, output, errors, wrong, &refused).ok());
  EXPECT_EQ(refused, TokenUsage{}) << "a chunk that fails its check adds nothing";
  // Sums are held at the largest count rather than overflowing.
  TokenUsage near_the_top{.prompt_tokens = std::numeric_limits<int64_t>::max() - 5, .completion_tokens = 0};
  near_the_top.Add({.prompt_tokens = 10, .completion_tokens = 3});
  EXPECT_EQ(near_the_top.prompt_tokens, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(near_the_top.total(), std::numeric_limits<int64_t>::max());
}

// Of the completion, the reasoning tokens (response.body.usage.completion_tokens_details
// .reasoning_tokens) are added up too: only there, the later of duplicates, never more than the
// line's completion; an error line's add nothing.
TEST(VerifyChunk, APassingChunkAddsTheReasoningTokensItsOutputLinesState) {
  auto line = [](const std::string& id, const std::string& usage) {
    return absl::StrCat(R"({"custom_id":")", id, R"(","response":{"body":{"usage":)", usage, R"(}},"error":null})",
                        "\n");
  };
  const std::string output =
      line("a", R"({"prompt_tokens":7,"completion_tokens":30,"completion_tokens_details":{"reasoning_tokens":12}})") +
      // the details before the counts, and a duplicate: the later wins
      line("b", R"({"completion_tokens_details":{"reasoning_tokens":1,"reasoning_tokens":4},"completion_tokens":5})") +
      // a duplicate details object that holds none
      line("c", R"({"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":9},)"
                R"("completion_tokens_details":{}})") +
      // more reasoning than completion: counted as the completion
      line("d", R"({"completion_tokens":3,"completion_tokens_details":{"reasoning_tokens":50}})") +
      // in the wrong places: at usage's own level, under prompt_tokens_details, in an array, a string
      line("e", R"({"completion_tokens":100,"reasoning_tokens":100,"prompt_tokens_details":{"reasoning_tokens":100},)"
                R"("completion_tokens_details":[{"reasoning_tokens":100}]})") +
      line("f", R"({"completion_tokens":100,"completion_tokens_details":{"reasoning_tokens":"100"}})");
  const std::string errors = absl::StrCat(
      R"({"custom_id":"g","response":{"body":{"usage":{"completion_tokens":500,)",
      R"("completion_tokens_details":{"reasoning_tokens":500}}}},"error":{"code":"x"}})", "\n");
  const std::vector<std::string> ids = {"a", "b", "c", "d", "e", "f", "g"};
  TokenUsage tokens{.prompt_tokens = 0, .completion_tokens = 0, .reasoning_tokens = 1};  // added to
  ASSERT_OK(VerifyChunk(Chunk{1, 0, 0, 7, 1}, output, errors, ids, &tokens));
  EXPECT_EQ(tokens.prompt_tokens, 7);
  EXPECT_EQ(tokens.completion_tokens, 30 + 5 + 9 + 3 + 100 + 100);
  EXPECT_EQ(tokens.reasoning_tokens, 1 + 12 + 4 + 3);
}

TEST(VerifyChunk, RecordsWithoutACustomIdAreAnsweredByNullErrorLines) {
  // What a runner writes for an unparseable line: custom_id null (expected: "").
  std::vector<std::string> records = {RequestLine("a"), "not json", R"({"custom_id":7,"prompt":"p"})"};
  std::vector<std::string> ids = ExpectedCustomIds(records, 0, 3);
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "", "7"}));
  Chunk chunk{1, 0, 0, 3, 1};
  EXPECT_OK(VerifyChunk(chunk, Ok("a") + Ok("7"), Err(""), ids));
  // A line claiming a custom_id for a record that has none is a forgery.
  EXPECT_FALSE(VerifyChunk(chunk, Ok("a") + Ok("7"), Err("x"), ids).ok());
}

TEST(VerifyChunk, DuplicateCustomIdsAreMatchedInOrder) {
  Chunk chunk{1, 0, 0, 3, 1};
  EXPECT_OK(VerifyChunk(chunk, Ok("a") + Ok("b"), Err("a"), {"a", "a", "b"}));
  EXPECT_OK(VerifyChunk(Chunk{1, 0, 0, 3, 2}, Ok("a"), Err("a") + Err("b"), {"a", "a", "b"}));
  EXPECT_OK(VerifyChunk(Chunk{1, 0, 0, 3, 1}, Ok("a") + Ok("a"), Err("b"), {"a", "b", "a"}));
}

TEST(VerifyChunk, ForgeriesAreRefusedWithWhatIsWrong) {
  const std::vector<std::string> ids = {"a", "b", "c"};
  Chunk chunk{2, 5, 10, 13, 0};
  auto why = [&](const std::string& out, const std::string& err, int64_t failed = 0) {
    Chunk c = chunk;
    c.records_failed = failed;
    absl::Status s = VerifyChunk(c, out, err, ids);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  EXPECT_THAT(why(Ok("a") + Ok("b"), ""), HasSubstr("chunk 5 of attempt 2 (records 10-12) holds 2 output and 0 error lines"));
  EXPECT_THAT(why(Ok("a") + Ok("b") + Ok("c") + Ok("c"), ""), HasSubstr("holds 4 output"));
  EXPECT_THAT(why(Ok("a") + Ok("c") + Ok("b"), ""), HasSubstr("record 11 (custom_id 'b') is not answered: output line 2 answers 'c'"));
  EXPECT_THAT(why(Ok("a") + Ok("b"), Err("c")), HasSubstr("claims 0 failed records but holds 1 error lines"));
  EXPECT_THAT(why(Ok("a") + Ok("b") + Err("c"), ""), HasSubstr("output line 3 is an error line"));
  EXPECT_THAT(why(Ok("a") + Ok("b"), Ok("c"), 1), HasSubstr("error line 1 is not an error"));
  EXPECT_THAT(why("[1]\n" + Ok("b") + Ok("c"), ""), HasSubstr("output line 1 is not a JSON object"));
  EXPECT_THAT(why(std::string(100, '[') + "\n" + Ok("b") + Ok("c"), ""), HasSubstr("output line 1 is not a JSON object"));
  // A response line whose custom_id is a number is not the string the record asked for.
  EXPECT_THAT(why(R"({"custom_id":1,"response":{},"error":null})" "\n" + Ok("b") + Ok("c"), ""),
              HasSubstr("output line 1 answers no custom_id"));
  // A range the task does not have.
  EXPECT_THAT(std::string(VerifyChunk(Chunk{1, 0, 0, 4, 0}, "", "", ids).message()), HasSubstr("claims a range"));
}

TEST(ReadChunkObject, StopsAtTheLimit) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto blobs, LocalBlobStore::Open(dir.path()));
  ASSERT_OK(blobs->Put("k", std::string(10000, 'x')));
  EXPECT_OK(ReadChunkObject(*blobs, "k", 10000));
  auto big = ReadChunkObject(*blobs, "k", 9999);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("larger than 9999 bytes"));
  EXPECT_EQ(ReadChunkObject(*blobs, "missing", 10).status().code(), absl::StatusCode::kNotFound);
}

// A job of team `team` whose one task holds the records `ids`, leased by a fresh executor: what
// the checker's tests screen. Sets `job`, `executor` and the lease's `attempt`.
void LeaseOneTaskJob(MetadataStore& store, BlobStore& blobs, FakeClock& clock, const std::vector<std::string>& ids,
                     const std::string& team, Job* job, Executor* executor, int* attempt) {
  std::string input;
  for (const std::string& id : ids) input += RequestLine(id) + "\n";
  ASSERT_OK(blobs.Put("inputs/in.jsonl", input));
  const int64_t records = static_cast<int64_t>(ids.size());
  ASSERT_OK_AND_ASSIGN(SplitResult split, SplitInput(blobs, "inputs/in.jsonl", records));
  JobSpec spec;
  spec.model = "m";
  spec.team = team;
  spec.input_key = "inputs/in.jsonl";
  ASSERT_OK_AND_ASSIGN(*job, store.CreateJob(spec, clock.Now()));
  ASSERT_OK(store.AddTasks(job->id, split.tasks, records, clock.Now()));
  ExecutorInfo info;
  info.name = "e";
  info.runners = {"llama"};
  info.max_tasks = 1;
  ASSERT_OK_AND_ASSIGN(*executor, store.RegisterExecutor("", info, clock.Now()));
  ASSERT_OK_AND_ASSIGN(std::vector<Lease> leases, store.LeaseTasks(executor->id, 1, absl::Seconds(30), clock.Now()));
  ASSERT_EQ(leases.size(), 1u);
  *attempt = leases[0].task.attempt;
}

// The object store that cannot be read for a while: the checker neither commits nor refuses.
class FlakyBlobStore : public ForwardingBlobStore {
 public:
  using ForwardingBlobStore::ForwardingBlobStore;
  bool down = false;
  absl::StatusOr<std::string> Get(const std::string& key) override {
    if (down) return absl::UnavailableError("down");
    return ForwardingBlobStore::Get(key);
  }
  absl::StatusOr<std::string> GetRange(const std::string& key, int64_t offset, int64_t length) override {
    if (down) return absl::UnavailableError("down");
    return ForwardingBlobStore::GetRange(key, offset, length);
  }
  absl::Status Read(const std::string& key, const std::function<bool(std::string_view)>& sink) override {
    if (down) return absl::UnavailableError("down");
    return ForwardingBlobStore::Read(key, sink);
  }
};

TEST(ChunkChecker, AnUnreadableChunkIsNeitherCommittedNorHeldAgainstTheExecutor) {
  TempDir dir;
  FakeClock clock;
  ASSERT_OK_AND_ASSIGN(auto store, SqliteMetadataStore::Open(":memory:", StoreOptions{}));
  ASSERT_OK_AND_ASSIGN(auto local, LocalBlobStore::Open(dir.path()));
  FlakyBlobStore blobs(local.get());
  Job job;
  Executor executor;
  int attempt = 0;
  LeaseOneTaskJob(*store, blobs, clock, {"a", "b", "c"}, "", &job, &executor, &attempt);
  if (HasFatalFailure()) return;
  ASSERT_OK(blobs.Put(keys::ChunkOutput(job.id, 0, attempt, 0), Ok("a") + Ok("b")));
  ChunkChecker checker(store.get(), &blobs);
  LeaseProgress progress{job.id, 0, attempt, 2, 0, {Chunk{attempt, 0, 0, 2, 0}}};
  blobs.down = true;
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply,
                       checker.Heartbeat(executor.id, ExecutorState::kBusy, "", {progress}, absl::Seconds(30), clock.Now()));
  EXPECT_THAT(reply.cancel, IsEmpty());
  ASSERT_OK_AND_ASSIGN(Task task, store->GetTask(job.id, 0));
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_THAT(task.chunks, IsEmpty());  // not committed unchecked
  LeaseProgress done = progress;
  done.records_done = 3;
  ASSERT_OK(blobs.Put(keys::ChunkOutput(job.id, 0, attempt, 1), Ok("c")));
  done.chunks.push_back(Chunk{attempt, 1, 2, 3, 0});
  EXPECT_EQ(checker.CompleteTasks(executor.id, {done}, clock.Now()).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(checker.rejected(), 0);
  // Back up: the same completion goes through.
  blobs.down = false;
  ASSERT_OK_AND_ASSIGN(std::vector<absl::Status> outcomes, checker.CompleteTasks(executor.id, {done}, clock.Now()));
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_OK(outcomes[0]);
  ASSERT_OK_AND_ASSIGN(task, store->GetTask(job.id, 0));
  EXPECT_EQ(task.state, TaskState::kSucceeded);
  EXPECT_EQ(task.chunks.size(), 2u);
}

// Reads of one object are held until `readers` threads have all started reading it: two screens
// that read the same chunk side by side meet there, whatever the scheduling.
class MeetingBlobStore : public ForwardingBlobStore {
 public:
  MeetingBlobStore(BlobStore* inner, std::string key, int readers)
      : ForwardingBlobStore(inner), key_(std::move(key)), readers_(readers) {}
  absl::Status Read(const std::string& key, const std::function<bool(std::string_view)>& sink) override {
    if (key == key_) {
      absl::MutexLock lock(&mu_);
      ++arrived_;
      // Bounded only so that a broken checker fails the test instead of hanging it.
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](MeetingBlobStore* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
                                 return self->arrived_ >= self->readers_;
                               },
                               this),
                           absl::Minutes(1));
    }
    return ForwardingBlobStore::Read(key, sink);
  }
  int arrived() {
    absl::MutexLock lock(&mu_);
    return arrived_;
  }

 private:
  const std::string key_;
  const int readers_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
};

// An executor lists its last chunk in a heartbeat and completes at once: the heartbeat's screen
// and the completion's read the chunk side by side, both before either has admitted it. Its
// tokens are counted once, by whichever admits it first.
TEST(ChunkChecker, AChunkTwoScreensReadSideBySideCountsItsTokensOnce) {
  TempDir dir;
  FakeClock clock;
  ASSERT_OK_AND_ASSIGN(auto store, SqliteMetadataStore::Open(dir.path() + "/store.db", StoreOptions{}));
  ASSERT_OK_AND_ASSIGN(auto local, LocalBlobStore::Open(dir.path() + "/blobs"));
  Job job;
  Executor executor;
  int attempt = 0;
  LeaseOneTaskJob(*store, *local, clock, {"a", "b"}, "t", &job, &executor, &attempt);
  if (HasFatalFailure()) return;
  const std::string chunk_key = keys::ChunkOutput(job.id, 0, attempt, 0);
  const Json used = {{"usage", {{"prompt_tokens", 7}, {"completion_tokens", 3}}}};
  ASSERT_OK(local->Put(chunk_key, DumpJson(MakeResponseLine("a", used)) + "\n" +
                                      DumpJson(MakeResponseLine("b", used)) + "\n"));
  MeetingBlobStore blobs(local.get(), chunk_key, 2);
  metrics::Registry registry;
  ServerMetrics metrics(&registry, store.get());
  ChunkChecker checker(store.get(), &blobs, {}, nullptr, &metrics);

  LeaseProgress listed{job.id, 0, attempt, 2, 0, {Chunk{attempt, 0, 0, 2, 0}}};
  std::thread heartbeat([&] {
    EXPECT_OK(checker.Heartbeat(executor.id, ExecutorState::kBusy, "", {listed}, absl::Seconds(30), clock.Now())
                  .status());
  });
  std::thread completion([&] { EXPECT_OK(checker.CompleteTasks(executor.id, {listed}, clock.Now()).status()); });
  heartbeat.join();
  completion.join();
  ASSERT_EQ(blobs.arrived(), 2) << "the two screens did not both read the chunk";
  ASSERT_OK_AND_ASSIGN(Task task, store->GetTask(job.id, 0));
  EXPECT_EQ(task.state, TaskState::kSucceeded);
  auto m = ParsePrometheusSamples(registry.Render());
  EXPECT_EQ(m["minions_tokens_total{team=\"t\",kind=\"prompt\"}"], 14);
  EXPECT_EQ(m["minions_tokens_total{team=\"t\",kind=\"completion\"}"], 6);
}

}  // namespace
}  // namespace minions::testing

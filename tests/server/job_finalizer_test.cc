#include "server/job_finalizer.h"

#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "blob/local/local_blob_store.h"
#include "runner/batch_record.h"
#include "server/job_splitter.h"
#include "server/keys.h"
#include "server/proto_convert.h"
#include "server_test_util.h"
#include "store_fixture.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"

namespace minions::testing {
namespace {

constexpr absl::Duration kTtl = absl::Seconds(30);

// Non-empty lines of a JSONL text.
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) out.emplace_back(std::string(line));
  return out;
}

// The custom_id of each line of a JSONL text.
std::vector<std::string> CustomIds(const std::string& text) {
  std::vector<std::string> ids;
  for (const std::string& line : Lines(text)) {
    auto json = ParseJson(line);
    if (!json.ok() || !json->contains("custom_id")) {
      ids.push_back("<bad line: " + line + ">");
    } else {
      ids.push_back((*json)["custom_id"].is_string() ? (*json)["custom_id"].get<std::string>() : "<null>");
    }
  }
  return ids;
}

class JobFinalizerTest : public StoreAndBlobsTest {
 protected:
  void SetUp() override {
    StoreAndBlobsTest::SetUp();
    ExecutorInfo info;
    info.name = "test-executor";
    info.memory_bytes = int64_t{8} << 30;
    info.runners = {"llama"};
    info.max_tasks = 8;
    auto executor = store_->RegisterExecutor("", info, clock_.Now());
    ASSERT_OK(executor);
    executor_ = executor->id;
  }

  // Stores `input`, splits it into tasks of `shard_size` records and makes a queued job of it.
  std::string MakeJob(const std::string& input, int64_t shard_size, const std::string& name = "in",
                      std::optional<absl::Duration> completion_window = std::nullopt) {
    std::string key = absl::StrCat("inputs/", name, ".jsonl");
    EXPECT_OK(blobs_->Put(key, input));
    auto split = SplitInput(*blobs_, key, shard_size);
    EXPECT_OK(split);
    JobSpec spec;
    spec.model = "/models/tiny.gguf";
    spec.input_key = key;
    spec.shard_size = shard_size;
    spec.max_attempts = 3;
    spec.completion_window = completion_window;
    auto job = store_->CreateJob(spec, clock_.Now());
    EXPECT_OK(job);
    EXPECT_OK(store_->AddTasks(job->id, split->tasks, split->total_records, clock_.Now()));
    return job->id;
  }

  std::vector<Lease> LeaseAll() {
    auto leases = store_->LeaseTasks(executor_, 16, kTtl, clock_.Now());
    EXPECT_OK(leases);
    return leases.ok() ? *leases : std::vector<Lease>{};
  }

  // What an executor does at the end of an attempt: upload the per-attempt objects, then report.
  void Upload(const std::string& job_id, int64_t task, int attempt, const std::string& output,
              const std::string& errors) {
    ASSERT_OK(blobs_->Put(keys::ChunkOutput(job_id, task, attempt, 0), output));
    ASSERT_OK(blobs_->Put(keys::ChunkErrors(job_id, task, attempt, 0), errors));
  }
  void Complete(const std::string& job_id, int64_t task, int attempt, int64_t done, int64_t failed = 0) {
    ASSERT_OK(store_->CompleteTask(executor_, job_id, task, attempt, done, failed, clock_.Now()));
  }

  Job GetJob(const std::string& job_id) {
    auto job = store_->GetJob(job_id);
    EXPECT_OK(job);
    return job.ok() ? *job : Job{};
  }
  std::string Get(const std::string& key) {
    auto data = blobs_->Get(key);
    EXPECT_OK(data);
    return data.ok() ? *data : "";
  }
  Json Manifest(const Job& job) {
    auto json = ParseJson(Get(job.manifest_key));
    EXPECT_OK(json);
    return json.ok() ? *json : Json();
  }

  static std::string Out(std::initializer_list<std::string> ids, const std::string& text = "ok") {
    std::string out;
    for (const auto& id : ids) absl::StrAppend(&out, OutputLine(id, text), "\n");
    return out;
  }
  static std::string Err(std::initializer_list<std::string> ids) {
    std::string out;
    for (const auto& id : ids) absl::StrAppend(&out, DumpJson(MakeErrorLine(id, "invalid_request", "bad")), "\n");
    return out;
  }

  std::string executor_;
};

// r0..r7: tasks [r0 r1 r2] [r3 r4 r5] [r6 r7].
std::string EightRecords() {
  std::string input;
  for (int i = 0; i < 8; ++i) absl::StrAppend(&input, RequestLine(absl::StrCat("r", i)), "\n");
  return input;
}

TEST_F(JobFinalizerTest, MergesOutOfOrderCompletionsInInputOrder) {
  std::string job_id = MakeJob(EightRecords(), 3);
  ASSERT_EQ(GetJob(job_id).n_tasks, 3);
  std::vector<Lease> leases = LeaseAll();
  ASSERT_EQ(leases.size(), 3u);
  for (const Lease& lease : leases) ASSERT_EQ(lease.task.attempt, 1);

  // Task 2 finishes first, then 0, then 1 (which has an error line for r4).
  Upload(job_id, 2, 1, Out({"r6", "r7"}), "");
  Complete(job_id, 2, 1, 2);
  clock_.Advance(absl::Seconds(1));
  Upload(job_id, 0, 1, Out({"r0", "r1", "r2"}), "");
  Complete(job_id, 0, 1, 3);
  EXPECT_EQ(GetJob(job_id).state, JobState::kRunning);
  // Before the last task, there is nothing to finalise.
  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(Job early, finalizer.Finalize(job_id));
  EXPECT_EQ(early.state, JobState::kRunning);
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> written, blobs_->List(absl::StrCat("jobs/", job_id, "/results/")));
  EXPECT_THAT(written, IsEmpty());

  Upload(job_id, 1, 1, Out({"r3", "r5"}), Err({"r4"}));
  Complete(job_id, 1, 1, 3, 1);
  ASSERT_EQ(GetJob(job_id).state, JobState::kFinalizing);

  ASSERT_OK_AND_ASSIGN(Job job, finalizer.Finalize(job_id));
  EXPECT_EQ(job.state, JobState::kCompleted);
  EXPECT_THAT(job.output_key, MatchesRegex(absl::StrCat("jobs/", job_id, "/results/[0-9a-f]{16}/output.jsonl")));
  const std::string writer = job.output_key.substr(0, job.output_key.rfind('/') + 1);
  EXPECT_EQ(job.errors_key, writer + "errors.jsonl");
  EXPECT_EQ(job.manifest_key, writer + "manifest.json");
  EXPECT_EQ(job.counts.total, 8);
  EXPECT_EQ(job.counts.completed, 7);
  EXPECT_EQ(job.counts.failed, 1);
  EXPECT_TRUE(job.finished_at.has_value());

  EXPECT_THAT(CustomIds(Get(job.output_key)), ElementsAre("r0", "r1", "r2", "r3", "r5", "r6", "r7"));
  EXPECT_THAT(CustomIds(Get(job.errors_key)), ElementsAre("r4"));

  Json manifest = Manifest(job);
  EXPECT_EQ(manifest["job_id"], job_id);
  EXPECT_EQ(manifest["request_counts"]["total"], 8);
  EXPECT_EQ(manifest["request_counts"]["failed"], 1);
  ASSERT_EQ(manifest["tasks"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const Json& entry = manifest["tasks"][i];
    EXPECT_EQ(entry["index"], i);
    EXPECT_EQ(entry["state"], "succeeded");
    EXPECT_EQ(entry["attempt"], 1);
    ASSERT_EQ(entry["chunks"].size(), 1u);
    EXPECT_EQ(entry["chunks"][0]["output_key"], keys::ChunkOutput(job_id, i, 1, 0));
    EXPECT_EQ(entry["chunks"][0]["errors_key"], keys::ChunkErrors(job_id, i, 1, 0));
  }
  EXPECT_EQ(manifest["tasks"][1]["records_failed"], 1);
  EXPECT_EQ(manifest["verification"]["checked"], 0);  // nobody re-scored any of it
}

// The manifest says which records other executors re-scored (docs/verification.md), by whom.
TEST_F(JobFinalizerTest, TheManifestCountsTheRecordsOtherExecutorsReScored) {
  std::string job_id = MakeJob(EightRecords(), 8);
  ExecutorInfo info;
  info.name = "verifier";
  info.memory_bytes = int64_t{8} << 30;
  info.runners = {"llama"};
  ASSERT_OK_AND_ASSIGN(Executor verifier, store_->RegisterExecutor("", info, clock_.Now()));
  ASSERT_EQ(LeaseAll().size(), 1u);
  Upload(job_id, 0, 1, Out({"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"}), "");
  for (const std::string record : {"r2", "r5"}) {
    Verification v;
    v.job_id = job_id;
    v.custom_id = record;
    v.producer_id = executor_;
    v.verifier_id = verifier.id;
    v.passed = true;
    ASSERT_OK(store_->RecordVerification(v, clock_.Now()));
  }
  Complete(job_id, 0, 1, 8);
  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(Job job, finalizer.Finalize(job_id));
  ASSERT_EQ(job.state, JobState::kCompleted);
  const Json manifest = Manifest(job);
  const Json& verification = manifest["verification"];
  EXPECT_EQ(verification["checked"], 2);
  EXPECT_EQ(verification["passed"], 2);
  EXPECT_EQ(verification["failed"], 0);
  EXPECT_EQ(verification["verifiers"], Json::array({verifier.id}));
  EXPECT_EQ(verification["failed_records"], Json::array());
}

// A line as the runner writes it, its body's usage stating the tokens it used (and, from a model
// whose template reasons, how many of them were reasoning).
std::string LineUsing(const std::string& id, int prompt, int completion, std::optional<int> reasoning = std::nullopt) {
  const std::string details =
      reasoning ? absl::StrCat(R"(,"completion_tokens_details":{"reasoning_tokens":)", *reasoning, "}") : "";
  return absl::StrCat(R"({"custom_id":")", id, R"(","response":{"status_code":200,"body":{"usage":{"prompt_tokens":)",
                      prompt, R"(,"completion_tokens":)", completion, R"(,"total_tokens":)", prompt + completion,
                      details, R"(}}},"error":null})", "\n");
}

// The tokens a finished job's answers used are the sums of its published output lines' usage:
// kept with the job and in its manifest. A chunk that is not published (rewritten after its
// commit) adds nothing, nor do error lines.
TEST_F(JobFinalizerTest, AFinishedJobCarriesTheTokensItsPublishedAnswersUsed) {
  std::string job_id = MakeJob(EightRecords(), 3);
  ASSERT_EQ(LeaseAll().size(), 3u);
  Upload(job_id, 0, 1, LineUsing("r0", 10, 1) + LineUsing("r1", 20, 2, 1) + LineUsing("r2", 30, 3), "");
  Complete(job_id, 0, 1, 3);
  Upload(job_id, 1, 1, LineUsing("r3", 100, 10, 7) + LineUsing("r5", 200, 20),
         absl::StrCat(R"({"custom_id":"r4","response":{"body":{"usage":{"prompt_tokens":5000}}},"error":{"code":"x"}})",
                      "\n"));
  Complete(job_id, 1, 1, 3, 1);
  Upload(job_id, 2, 1, LineUsing("r6", 1000, 100) + LineUsing("r7", 1000, 100), "");
  Complete(job_id, 2, 1, 2);
  // Task 2's output is rewritten after its commit (a presigned URL still valid): not published.
  ASSERT_OK(blobs_->Put(keys::ChunkOutput(job_id, 2, 1, 0),
                        LineUsing("r6", 1 << 30, 1 << 30, 1 << 30) + LineUsing("x", 1, 1)));
  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(Job job, finalizer.Finalize(job_id));
  ASSERT_EQ(job.state, JobState::kCompleted);
  ASSERT_TRUE(job.tokens.has_value());
  EXPECT_EQ(job.tokens->prompt_tokens, 360);
  EXPECT_EQ(job.tokens->completion_tokens, 36);
  EXPECT_EQ(job.tokens->reasoning_tokens, 8);
  EXPECT_EQ(GetJob(job_id).tokens, job.tokens);
  Json manifest = Manifest(job);
  EXPECT_EQ(manifest["usage"]["prompt_tokens"], 360);
  EXPECT_EQ(manifest["usage"]["completion_tokens"], 36);
  EXPECT_EQ(manifest["usage"]["completion_tokens_details"]["reasoning_tokens"], 8);
  // As GetJob answers it (`minions status` prints the three).
  const v1::Job proto = ToProto(job);
  EXPECT_EQ(proto.prompt_tokens(), 360);
  EXPECT_EQ(proto.completion_tokens(), 36);
  EXPECT_EQ(proto.reasoning_tokens(), 8);
}

// A cancelled job's merged partial output states the tokens it used: the committed chunks' lines,
// a task's committed checkpoint included; the job's row keeps none.
TEST_F(JobFinalizerTest, ACancelledJobsPartialOutputStatesTheTokensItUsed) {
  std::string job_id = MakeJob(EightRecords(), 3);
  ASSERT_EQ(LeaseAll().size(), 3u);
  Upload(job_id, 0, 1, LineUsing("r0", 10, 1) + LineUsing("r1", 20, 2) + LineUsing("r2", 30, 3, 2), "");
  Complete(job_id, 0, 1, 3);
  // Task 1 committed r3 as a checkpoint; task 2 did nothing.
  ASSERT_OK(blobs_->Put(keys::ChunkOutput(job_id, 1, 1, 0), LineUsing("r3", 100, 10, 5)));
  LeaseProgress beat{job_id, 1, 1, 1, 0, {Chunk{1, 0, 0, 1, 0}}};
  ASSERT_OK(store_->Heartbeat(executor_, ExecutorState::kBusy, "", {beat}, kTtl, clock_.Now()).status());
  ASSERT_OK(store_->CancelJob(job_id, clock_.Now()).status());

  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(TokenUsage tokens, finalizer.MergeCancelled(job_id));
  EXPECT_EQ(tokens.prompt_tokens, 160);
  EXPECT_EQ(tokens.completion_tokens, 16);
  EXPECT_EQ(tokens.reasoning_tokens, 7);
  EXPECT_THAT(CustomIds(Get(keys::CancelledJobOutput(job_id))), ElementsAre("r0", "r1", "r2", "r3"));
  EXPECT_FALSE(GetJob(job_id).tokens.has_value());
  // Merged again, the same answer.
  ASSERT_OK_AND_ASSIGN(TokenUsage again, finalizer.MergeCancelled(job_id));
  EXPECT_EQ(again, tokens);
}

TEST_F(JobFinalizerTest, TaskOutputsWithoutAFinalNewlineStillMergeIntoSeparateLines) {
  std::string job_id = MakeJob(EightRecords(), 3);
  ASSERT_EQ(LeaseAll().size(), 3u);
  auto chop = [](std::string s) {
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  };
  Upload(job_id, 0, 1, chop(Out({"r0", "r1", "r2"})), "");
  Upload(job_id, 1, 1, chop(Out({"r3", "r4"})), chop(Err({"r5"})));
  Upload(job_id, 2, 1, Out({"r6", "r7"}), Err({}));
  Complete(job_id, 0, 1, 3);
  Complete(job_id, 1, 1, 3, 1);
  Complete(job_id, 2, 1, 2);
  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(Job job, finalizer.Finalize(job_id));
  ASSERT_EQ(job.state, JobState::kCompleted);
  EXPECT_THAT(CustomIds(Get(job.output_key)), ElementsAre("r0", "r1", "r2", "r3", "r4", "r6", "r7"));
  EXPECT_THAT(CustomIds(Get(job.errors_key)), ElementsAre("r5"));
}

TEST_F(JobFinalizerTest, AMissingErrorsObjectMeansNoErrorLines) {
  std::string job_id = MakeJob(EightRecords(), 100);
  ASSERT_EQ(LeaseAll().size(), 1u);
  ASSERT_OK(blobs_->Put(keys::ChunkOutput(job_id, 0, 1, 0), Out({"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"})));
  Complete(job_id, 0, 1, 8);
  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(Job job, finalizer.Finalize(job_id));
  ASSERT_EQ(job.state, JobState::kCompleted);
  EXPECT_EQ(Lines(Get(job.output_key)).size(), 8u);
  EXPECT_EQ(Get(job.errors_key), "");
}

TEST_F(JobFinalizerTest, ARerunTaskUsesItsLastAttemptsObjects) {
  std::string job_id = MakeJob(EightRecords(), 3);
  ASSERT_EQ(LeaseAll().size(), 3u);
  // Attempt 1 of task 1 uploads, then fails (it crashed before reporting, say): its objects stay.
  Upload(job_id, 1, 1, Out({"r3", "r4", "r5"}, "STALE"), Err({"r4"}));
  ASSERT_OK(store_->FailTask(executor_, job_id, 1, 1, FailureClass::kRetryable, "runner crashed", clock_.Now()));
  Upload(job_id, 0, 1, Out({"r0", "r1", "r2"}), "");
  Complete(job_id, 0, 1, 3);
  Upload(job_id, 2, 1, Out({"r6", "r7"}), "");
  Complete(job_id, 2, 1, 2);

  clock_.Advance(absl::Minutes(1));  // past the retry backoff
  std::vector<Lease> again = LeaseAll();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].task.index, 1);
  EXPECT_EQ(again[0].task.attempt, 2);
  Upload(job_id, 1, 2, Out({"r3", "r4", "r5"}, "fresh"), "");
  Complete(job_id, 1, 2, 3);

  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(Job job, finalizer.Finalize(job_id));
  ASSERT_EQ(job.state, JobState::kCompleted);
  std::string output = Get(job.output_key);
  EXPECT_THAT(CustomIds(output), ElementsAre("r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"));
  EXPECT_THAT(output, HasSubstr("fresh"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("STALE")));
  EXPECT_EQ(Get(job.errors_key), "");  // attempt 1's error line is not read
  EXPECT_EQ(job.counts.failed, 0);
  // The stale objects are still there, beside the winner's.
  EXPECT_TRUE(blobs_->Size(keys::ChunkOutput(job_id, 1, 1, 0)).ok());

  Json manifest = Manifest(job);
  EXPECT_EQ(manifest["tasks"][0]["attempt"], 1);
  EXPECT_EQ(manifest["tasks"][1]["attempt"], 2);
  EXPECT_EQ(manifest["tasks"][1]["failures"], 1);
  EXPECT_EQ(manifest["tasks"][1]["chunks"][0]["output_key"], keys::ChunkOutput(job_id, 1, 2, 0));
  EXPECT_EQ(manifest["tasks"][1]["chunks"][0]["errors_key"], keys::ChunkErrors(job_id, 1, 2, 0));
}

TEST_F(JobFinalizerTest, APermanentlyFailedTaskGetsAnErrorLinePerRecord) {
  // Task 1 holds r3, an invalid line that still names its custom_id, a blank line, and r5.
  std::string input = absl::StrCat(RequestLine("r0"), "\n", RequestLine("r1"), "\n", RequestLine("r2"), "\n",
                                   RequestLine("r3"), "\n", R"({"custom_id":"bad4","method":"GET"})", "\n",
                                   "\r\n", RequestLine("r5"), "\n", RequestLine("r6"), "\n");
  std::string job_id = MakeJob(input, 3);
  ASSERT_EQ(GetJob(job_id).n_tasks, 3);
  ASSERT_EQ(LeaseAll().size(), 3u);
  Upload(job_id, 0, 1, Out({"r0", "r1"}), Err({"r2"}));
  Complete(job_id, 0, 1, 3, 1);
  ASSERT_OK(store_->FailTask(executor_, job_id, 1, 1, FailureClass::kPermanent, "model file is corrupt",
                             clock_.Now()));
  Upload(job_id, 2, 1, Out({"r6"}), "");
  Complete(job_id, 2, 1, 1);

  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(Job job, finalizer.Finalize(job_id));
  ASSERT_EQ(job.state, JobState::kCompleted);
  EXPECT_EQ(job.counts.total, 7);
  EXPECT_EQ(job.counts.completed, 3);
  EXPECT_EQ(job.counts.failed, 4);
  EXPECT_THAT(CustomIds(Get(job.output_key)), ElementsAre("r0", "r1", "r6"));
  std::string errors = Get(job.errors_key);
  EXPECT_THAT(CustomIds(errors), ElementsAre("r2", "r3", "bad4", "r5"));
  std::vector<std::string> lines = Lines(errors);
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 1; i < 4; ++i) {
    SCOPED_TRACE(lines[i]);
    auto line = ParseJson(lines[i]);
    ASSERT_OK(line);
    EXPECT_EQ((*line)["error"]["code"], "task_failed");
    EXPECT_THAT((*line)["error"]["message"].get<std::string>(), HasSubstr("model file is corrupt"));
    EXPECT_TRUE((*line)["response"].is_null());
  }

  Json manifest = Manifest(job);
  EXPECT_EQ(manifest["tasks"][1]["state"], "failed");
  EXPECT_EQ(manifest["tasks"][1]["error"], "model file is corrupt");
  EXPECT_FALSE(manifest["tasks"][1].contains("output_key"));
}

TEST_F(JobFinalizerTest, TwoServersFinalisingOneJobBothSucceedOnce) {
  std::string job_id = MakeJob(EightRecords(), 3);
  ASSERT_EQ(LeaseAll().size(), 3u);
  Upload(job_id, 0, 1, Out({"r0", "r1", "r2"}), "");
  Upload(job_id, 1, 1, Out({"r3", "r4", "r5"}), "");
  Upload(job_id, 2, 1, Out({"r6", "r7"}), "");
  Complete(job_id, 0, 1, 3);
  Complete(job_id, 1, 1, 3);
  Complete(job_id, 2, 1, 2);

  // Two servers at once, on one store and one object store.
  JobFinalizer a(store_.get(), blobs_.get(), &clock_);
  JobFinalizer b(store_.get(), blobs_.get(), &clock_);
  absl::StatusOr<Job> result_a, result_b;
  std::thread ta([&] { result_a = a.Finalize(job_id); });
  std::thread tb([&] { result_b = b.Finalize(job_id); });
  ta.join();
  tb.join();
  ASSERT_OK(result_a);
  ASSERT_OK(result_b);
  EXPECT_EQ(result_a->state, JobState::kCompleted);
  EXPECT_EQ(result_b->state, JobState::kCompleted);
  EXPECT_EQ(result_a->output_key, result_b->output_key);
  EXPECT_EQ(result_a->finished_at, result_b->finished_at);  // one FinishJob won

  // And one after the other: the second sees a completed job and changes nothing.
  clock_.Advance(absl::Minutes(5));
  ASSERT_OK_AND_ASSIGN(Job again, b.Finalize(job_id));
  EXPECT_EQ(again.state, JobState::kCompleted);
  EXPECT_EQ(again.finished_at, result_a->finished_at);
  EXPECT_THAT(CustomIds(Get(again.output_key)), ElementsAre("r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"));
  // No temporary files left next to the results.
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> results, blobs_->List(absl::StrCat("jobs/", job_id, "/results/")));
  EXPECT_EQ(results.size(), 3u) << ::testing::PrintToString(results);
}

// The object store of one server in a two-server race: it records the keys written through it,
// and runs `before_first_write` (once) when its server starts writing results.
class InterleavingBlobStore : public ForwardingBlobStore {
 public:
  using ForwardingBlobStore::ForwardingBlobStore;
  std::function<void()> before_first_write;
  std::vector<std::string> written;
  absl::Status Put(const std::string& key, std::string_view data) override {
    Writing(key);
    return ForwardingBlobStore::Put(key, data);
  }
  absl::Status PutStream(const std::string& key, const std::function<absl::StatusOr<std::string>()>& source) override {
    Writing(key);
    return ForwardingBlobStore::PutStream(key, source);
  }

 private:
  void Writing(const std::string& key) {
    written.push_back(key);
    if (before_first_write) std::exchange(before_first_write, nullptr)();
  }
};

// Server B starts finalising; server A finalises the job all the way while B is still at its
// first write, and a client may already be reading A's results. B must never write over them (an
// object store need not replace an object atomically: the test S3 server rewrites it in place, and
// a reader saw a short output file), and it leaves no objects of its own behind.
TEST_F(JobFinalizerTest, AServerFinalisingLateNeverWritesOverThePublishedResults) {
  std::string job_id = MakeJob(EightRecords(), 3);
  ASSERT_EQ(LeaseAll().size(), 3u);
  Upload(job_id, 0, 1, Out({"r0", "r1", "r2"}), "");
  Upload(job_id, 1, 1, Out({"r3", "r4", "r5"}), "");
  Upload(job_id, 2, 1, Out({"r6"}), Err({"r7"}));
  Complete(job_id, 0, 1, 3);
  Complete(job_id, 1, 1, 3);
  Complete(job_id, 2, 1, 2, 1);
  ASSERT_EQ(GetJob(job_id).state, JobState::kFinalizing);

  JobFinalizer a(store_.get(), blobs_.get(), &clock_);
  InterleavingBlobStore b_blobs(blobs_.get());
  JobFinalizer b(store_.get(), &b_blobs, &clock_);
  absl::StatusOr<Job> published;
  b_blobs.before_first_write = [&] { published = a.Finalize(job_id); };
  ASSERT_OK_AND_ASSIGN(Job seen_by_b, b.Finalize(job_id));
  ASSERT_OK(published);
  ASSERT_EQ(published->state, JobState::kCompleted);
  EXPECT_EQ(seen_by_b.state, JobState::kCompleted);
  EXPECT_EQ(seen_by_b.output_key, published->output_key);
  ASSERT_FALSE(b_blobs.written.empty());
  for (const std::string& key : b_blobs.written) {
    EXPECT_NE(key, published->output_key);
    EXPECT_NE(key, published->errors_key);
    EXPECT_NE(key, published->manifest_key);
  }
  EXPECT_THAT(CustomIds(Get(published->output_key)), ElementsAre("r0", "r1", "r2", "r3", "r4", "r5", "r6"));
  EXPECT_THAT(CustomIds(Get(published->errors_key)), ElementsAre("r7"));
  // Only the published results are left.
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> results, blobs_->List(absl::StrCat("jobs/", job_id, "/results/")));
  EXPECT_THAT(results, ::testing::UnorderedElementsAre(published->output_key, published->errors_key,
                                                         published->manifest_key));
}

TEST_F(JobFinalizerTest, FinalizeOfAnUnknownJobIsNotFound) {
  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  EXPECT_EQ(finalizer.Finalize("job-000000000000").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobFinalizerTest, FinalizeReadyPicksUpEveryFinalizingJob) {
  std::string first = MakeJob(EightRecords(), 100, "first");
  std::string second = MakeJob(EightRecords(), 100, "second");
  std::string running = MakeJob(EightRecords(), 100, "running");
  std::vector<Lease> leases = LeaseAll();
  ASSERT_EQ(leases.size(), 3u);
  for (const std::string& job_id : {first, second}) {
    Upload(job_id, 0, 1, Out({"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"}, job_id), "");
    Complete(job_id, 0, 1, 8);
    ASSERT_EQ(GetJob(job_id).state, JobState::kFinalizing);
  }
  ASSERT_OK_AND_ASSIGN(auto waiting, store_->JobsToFinalize(10, clock_.Now()));
  ASSERT_EQ(waiting.size(), 2u);

  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(int done, finalizer.FinalizeReady());
  EXPECT_EQ(done, 2);
  for (const std::string& job_id : {first, second}) {
    Job job = GetJob(job_id);
    EXPECT_EQ(job.state, JobState::kCompleted);
    std::string output = Get(job.output_key);
    EXPECT_EQ(Lines(output).size(), 8u);
    EXPECT_THAT(output, HasSubstr(job_id));  // each job got its own tasks' output
  }
  EXPECT_EQ(GetJob(running).state, JobState::kRunning);
  EXPECT_EQ(GetJob(running).output_key, "");
  ASSERT_OK_AND_ASSIGN(auto none, store_->JobsToFinalize(10, clock_.Now()));
  EXPECT_THAT(none, IsEmpty());
  ASSERT_OK_AND_ASSIGN(int again, finalizer.FinalizeReady());
  EXPECT_EQ(again, 0);
}

// Uploads chunk `seq` of an attempt and commits it by heartbeat, as an executor does.
TEST_F(JobFinalizerTest, ChunksOfSeveralAttemptsMergeInRecordOrder) {
  std::string job_id = MakeJob(EightRecords(), 8);
  std::vector<Lease> leases = LeaseAll();
  ASSERT_EQ(leases.size(), 1u);
  // Attempt 1 commits r0..r2 in one chunk, uploads r3..r4 as a second chunk that never gets
  // committed, and dies.
  ASSERT_OK(blobs_->Put(keys::ChunkOutput(job_id, 0, 1, 0), Out({"r0", "r2"})));
  ASSERT_OK(blobs_->Put(keys::ChunkErrors(job_id, 0, 1, 0), Err({"r1"})));
  ASSERT_OK(blobs_->Put(keys::ChunkOutput(job_id, 0, 1, 1), Out({"r3", "r4"}, "UNCOMMITTED")));
  LeaseProgress beat{job_id, 0, 1, 5, 1, {Chunk{1, 0, 0, 3, 1}}};
  ASSERT_OK(store_->Heartbeat(executor_, ExecutorState::kBusy, "", {beat}, kTtl, clock_.Now()).status());
  clock_.Advance(kTtl + absl::Seconds(1));
  ASSERT_OK(store_->ExpireLeases(clock_.Now(), 10).status());
  clock_.Advance(absl::Minutes(1));
  std::vector<Lease> again = LeaseAll();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(CommittedRecords(again[0].task), 3);
  // Attempt 2 runs r3..r7 only.
  ASSERT_OK(blobs_->Put(keys::ChunkOutput(job_id, 0, 2, 0), Out({"r3", "r4", "r5", "r6", "r7"})));
  ASSERT_OK(store_->CompleteTask(executor_, job_id, 0, 2, 8, 1, clock_.Now()));

  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(Job job, finalizer.Finalize(job_id));
  ASSERT_EQ(job.state, JobState::kCompleted);
  std::string output = Get(job.output_key);
  EXPECT_THAT(CustomIds(output), ElementsAre("r0", "r2", "r3", "r4", "r5", "r6", "r7"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("UNCOMMITTED")));
  EXPECT_THAT(CustomIds(Get(job.errors_key)), ElementsAre("r1"));
  EXPECT_EQ(job.counts.completed, 7);
  EXPECT_EQ(job.counts.failed, 1);
  Json chunks = Manifest(job)["tasks"][0]["chunks"];
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0]["attempt"], 1);
  EXPECT_EQ(chunks[1]["attempt"], 2);
  EXPECT_EQ(chunks[1]["begin"], 3);
}

TEST_F(JobFinalizerTest, AnExpiredJobKeepsWhatFinishedAndListsTheRestAsExpired) {
  std::string job_id = MakeJob(EightRecords(), 3, "in", absl::Hours(1));
  ASSERT_EQ(LeaseAll().size(), 3u);
  Upload(job_id, 0, 1, Out({"r0", "r1", "r2"}), "");
  Complete(job_id, 0, 1, 3);
  // Task 1 committed r3 before the deadline; task 2 did nothing.
  ASSERT_OK(blobs_->Put(keys::ChunkOutput(job_id, 1, 1, 0), Out({"r3"})));
  LeaseProgress beat{job_id, 1, 1, 1, 0, {Chunk{1, 0, 0, 1, 0}}};
  ASSERT_OK(store_->Heartbeat(executor_, ExecutorState::kBusy, "", {beat}, kTtl, clock_.Now()).status());
  clock_.Advance(absl::Hours(1));
  ASSERT_OK(store_->ExpireJob(job_id, clock_.Now()).status());

  JobFinalizer finalizer(store_.get(), blobs_.get(), &clock_);
  ASSERT_OK_AND_ASSIGN(Job job, finalizer.Finalize(job_id));
  EXPECT_EQ(job.state, JobState::kExpired);
  EXPECT_THAT(CustomIds(Get(job.output_key)), ElementsAre("r0", "r1", "r2", "r3"));
  std::string errors = Get(job.errors_key);
  EXPECT_THAT(CustomIds(errors), ElementsAre("r4", "r5", "r6", "r7"));
  EXPECT_THAT(errors, HasSubstr("batch_expired"));
  EXPECT_EQ(job.counts.completed, 4);
  EXPECT_EQ(job.counts.failed, 4);
}

}  // namespace
}  // namespace minions::testing

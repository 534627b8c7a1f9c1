// The attack suite of issue 17 on the server's side: one test per attack, each asserting the
// refusal AND that nothing else was lost (the job still completes with every other record, the
// server still answers). The executor's side (URLs, model paths, the runner's sandbox) is in
// tests/executor/.

#include <map>
#include <set>

#include "grpc_service_fixture.h"
#include "server/chunk_check.h"

namespace minions::testing {
namespace {

class AttackTest : public GrpcServiceTest {
 protected:
  // An output line answering `custom_id`, as an honest runner writes it.
  static std::string Answer(const std::string& custom_id, const std::string& text = "honest") {
    return DumpJson(MakeResponseLine(custom_id, Json{{"echo", text}})) + "\n";
  }
  static std::string Answers(const std::vector<std::string>& ids, const std::string& text = "honest") {
    std::string out;
    for (const auto& id : ids) out += Answer(id, text);
    return out;
  }
  static void WriteUrl(const std::string& url, const std::string& data) {
    auto path = FileUrlPath(url);
    ASSERT_OK(path);
    ASSERT_OK(WriteFileAtomically(*path, data));
  }
  static v1::Chunk ChunkOf(const v1::TaskLease& lease, int seq, int64_t begin, int64_t end, int64_t failed = 0) {
    v1::Chunk chunk;
    chunk.set_attempt(lease.ref().attempt());
    chunk.set_seq(seq);
    chunk.set_begin(begin);
    chunk.set_end(end);
    chunk.set_records_failed(failed);
    return chunk;
  }
  // A job of three records whose one task a new executor `name` completes with `output` and
  // `errors` as its chunk 0, claiming `claimed_failed` failed records: refused (INVALID_ARGUMENT,
  // naming `phrase`), the task is pending again, and an honest executor then serves every record.
  void ExpectForgedChunkRefused(const std::string& name, const std::string& output, const std::string& errors,
                                int64_t claimed_failed, const std::string& phrase) {
    v1::Job job = MustSubmit(Records(3), 3);
    std::string forger = RegisterExecutor(name);
    v1::TaskLease lease = MustLeaseOne(forger);
    WriteUrl(lease.chunk_urls(0).output_url(), output);
    WriteUrl(lease.chunk_urls(0).errors_url(), errors);
    EXPECT_GRPC_ERROR(CompleteWith(forger, lease, {ChunkOf(lease, 0, 0, 3, claimed_failed)}, claimed_failed),
                      INVALID_ARGUMENT, phrase);
    EXPECT_EQ(StoreTask(job.id(), 0).state, TaskState::kPending);
    ExpectEveryRecordOnceAndHonest(FinishHonestly(job.id()), 3);
  }
  // Completes `lease` reporting `chunks` (explicitly, as the executor does).
  grpc::Status CompleteWith(const std::string& executor, const v1::TaskLease& lease,
                            const std::vector<v1::Chunk>& chunks, int64_t failed = 0) {
    v1::CompleteRequest request;
    request.set_executor_id(executor);
    *request.mutable_ref() = lease.ref();
    request.mutable_ref()->set_records_done(lease.n_records());
    request.mutable_ref()->set_records_failed(failed);
    for (const auto& c : chunks) *request.mutable_ref()->add_chunks() = c;
    v1::CompleteResponse reply;
    return executors_->Complete(ExecutorContext(executor).get(), request, &reply);
  }
  v1::HeartbeatResponse Beat(const std::string& executor, const v1::TaskLease& lease, int64_t done,
                             const std::vector<v1::Chunk>& chunks) {
    v1::HeartbeatRequest request;
    request.set_executor_id(executor);
    request.set_state("busy");
    v1::LeaseRef* ref = request.add_leases();
    *ref = lease.ref();
    ref->set_records_done(done);
    for (const auto& c : chunks) *ref->add_chunks() = c;
    v1::HeartbeatResponse reply;
    grpc::Status status = executors_->Heartbeat(ExecutorContext(executor).get(), request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return reply;
  }
  // Serves every pending task honestly with a new executor and waits for the job to complete.
  v1::Job FinishHonestly(const std::string& job_id) {
    std::string honest = RegisterExecutor("honest");
    for (int round = 0; round < 20; ++round) {
      std::vector<v1::TaskLease> leases = MustLease(honest, 64);
      for (const v1::TaskLease& lease : leases) {
        auto [done, failed] = Serve(lease);
        EXPECT_TRUE(Complete(honest, lease.ref(), done, failed).ok());
      }
      v1::Job job = MustGetJob(job_id);
      if (job.state() == "finalizing" || job.state() == "completed") break;
      fake_clock_.Advance(absl::Minutes(10));  // past any retry backoff
    }
    return WaitForState(job_id, "completed");
  }
  // The job's output and error files: every record of `n` exactly once, the output honest.
  void ExpectEveryRecordOnceAndHonest(const v1::Job& job, int n, const std::set<std::string>& errors = {}) {
    auto [status, output] = Results(job.id());
    ASSERT_TRUE(status.ok()) << status.error_message();
    auto [error_status, error_lines] = Results(job.id(), /*errors=*/true);
    ASSERT_TRUE(error_status.ok()) << error_status.error_message();
    std::map<std::string, int> seen;
    for (const std::string& id : CustomIds(output)) ++seen[id];
    for (const std::string& id : CustomIds(error_lines)) ++seen[id];
    for (int i = 0; i < n; ++i) EXPECT_EQ(seen[absl::StrCat("r", i)], 1) << "r" << i;
    EXPECT_EQ(seen.size(), static_cast<size_t>(n)) << output << error_lines;
    std::set<std::string> failed;
    for (const std::string& id : CustomIds(error_lines)) failed.insert(id);
    EXPECT_EQ(failed, errors);
    EXPECT_THAT(output, Not(HasSubstr("forged")));
  }
};

// ------------------------------------------------------------------ input limits

// One 2 MB line of a million nested '[' (the shorthand) crashed the server inside SubmitJob and
// left the job validating for ever. Now it is that record's error; the job runs; the server lives.
TEST_F(AttackTest, ANestedJsonLineIsThatRecordsErrorAndTheJobRuns) {
  StartServer();
  std::string nested = R"({"custom_id":"r2","prompt":)" + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  std::string input = RequestLine("r0") + "\n" + RequestLine("r1") + "\n" + nested + "\n" + RequestLine("r3") + "\n";
  v1::Job job = MustSubmit(input, 2);
  EXPECT_EQ(job.state(), "queued");
  EXPECT_EQ(job.request_counts().total(), 4);
  ExpectServerUp();
  v1::Job done = FinishHonestly(job.id());
  EXPECT_EQ(done.request_counts().completed(), 3);
  EXPECT_EQ(done.request_counts().failed(), 1);
  auto [status, errors] = Results(job.id(), true);
  ASSERT_TRUE(status.ok());
  EXPECT_THAT(errors, HasSubstr("nested deeper than 64"));
  auto [ok, output] = Results(job.id());
  EXPECT_THAT(CustomIds(output), ElementsAreArray({"r0", "r1", "r3"}));
}

// 200,000 tasks from one 7 MB input at --shard-size 1: refused with a shard size that fits; the
// job does not stay validating; the jobs already there are untouched.
TEST_F(AttackTest, TwoHundredThousandTasksAreRefusedAndNothingElseIsTouched) {
  StartServer();
  v1::Job before = MustSubmit(Records(6), 3);
  std::string input;
  for (int i = 0; i < 200'000; ++i) absl::StrAppend(&input, R"({"custom_id":"x)", i, R"(","prompt":"p"})", "\n");
  ASSERT_GT(input.size(), 6u << 20);
  v1::Job refused;
  EXPECT_GRPC_ERROR(Submit(Request(input, 1), &refused), INVALID_ARGUMENT, "a job may have at most 10000");
  EXPECT_GRPC_ERROR(Submit(Request(input, 1), &refused), INVALID_ARGUMENT, "--shard-size 20");
  // Nothing was left validating, and no task of it exists.
  v1::ListJobsResponse jobs;
  ASSERT_GRPC_OK(jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), &jobs));
  for (const v1::Job& job : jobs.jobs()) {
    EXPECT_NE(job.state(), "validating") << job.id();
    if (job.id() != before.id()) {
      EXPECT_EQ(job.state(), "failed");
      EXPECT_EQ(job.n_tasks(), 0);
    }
  }
  // The shard size it suggests is accepted (and cancelled here: its 10,000 tasks are not the point).
  v1::Job fits = MustSubmit(input, 20);
  EXPECT_EQ(fits.n_tasks(), 10000);
  v1::Job cancelled;
  ASSERT_GRPC_OK(Cancel(fits.id(), &cancelled));
  // The job submitted before runs to completion as if nothing happened.
  ExpectEveryRecordOnceAndHonest(FinishHonestly(before.id()), 6);
}

// A shard size under the server's floor is refused before anything is stored.
TEST_F(AttackTest, AShardSizeUnderTheFloorIsRefused) {
  ServerOptions options = Options();
  options.min_shard_size = 10;
  StartServer(&fake_clock_, options);
  v1::Job job;
  EXPECT_GRPC_ERROR(Submit(Request(Records(100), 5), &job), INVALID_ARGUMENT, "at least 10 records per task");
  v1::ListJobsResponse jobs;
  ASSERT_GRPC_OK(jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), &jobs));
  EXPECT_THAT(jobs.jobs(), IsEmpty());
}

// 150 open watch streams made 150 server threads. The server holds at most max_watch_streams;
// the rest are refused at once, and every other call is still answered.
TEST_F(AttackTest, ManyWatchStreamsAreCappedAndTheServerStillAnswers) {
  // The real clock: a stream sleeps between updates, and must see its client leave by itself.
  ServerOptions options = Options();
  options.max_watch_streams = 8;
  StartServer(&real_clock_, options);
  v1::Job job = MustSubmit(Records(4), 2);
  struct Stream {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::JobProgress>> reader;
  };
  auto open_watch = [&]() {
    Stream s{Context(), nullptr};
    v1::WatchJobRequest request;
    request.set_job_id(job.id());
    request.set_interval_ms(200);  // the job never ends here: the stream stays open until its client leaves
    s.reader = jobs_->WatchJob(s.context.get(), request);
    return s;
  };
  std::vector<Stream> open;
  int accepted = 0, refused = 0;
  for (int i = 0; i < 150; ++i) {
    Stream s = open_watch();
    v1::JobProgress first;
    if (s.reader->Read(&first)) {
      ++accepted;
      open.push_back(std::move(s));
    } else {
      grpc::Status status = s.reader->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
      EXPECT_THAT(status.error_message(), HasSubstr("8 watch streams open"));
      ++refused;
    }
  }
  EXPECT_EQ(accepted, 8);
  EXPECT_EQ(refused, 142);
  // Everything else still works: submit, get, list, an executor's lease.
  ExpectServerUp();
  v1::Job other = MustSubmit(Records(2), 2);
  EXPECT_EQ(MustGetJob(other.id()).state(), "queued");
  EXPECT_FALSE(MustLease(RegisterExecutor("e"), 1).empty());
  // Watchers that leave give their slot back (the server sees it at its next update).
  for (Stream& s : open) s.context->TryCancel();
  for (Stream& s : open) (void)s.reader->Finish();
  open.clear();
  bool watched = false;
  for (int i = 0; i < 500 && !watched; ++i) {
    Stream s = open_watch();
    v1::JobProgress first;
    watched = s.reader->Read(&first);
    s.context->TryCancel();
    (void)s.reader->Finish();
    if (!watched) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(watched);
}

// ------------------------------------------------------------------ forged and oversized chunks

// An executor reports a completion whose output answers other custom_ids. The completion is
// refused, the attempt failed; another executor redoes the task; the output holds only honest lines.
TEST_F(AttackTest, AForgedChunkFailsItsAttemptAndNeverReachesTheOutput) {
  StartServer();
  auto [job, forger, lease] = SubmitAndLeaseOne(6, 3, "forger");
  ASSERT_EQ(lease.ref().task_index(), 0);
  WriteUrl(lease.chunk_urls(0).output_url(), Answers({"r0", "r1", "r9"}, "forged"));
  EXPECT_GRPC_ERROR(CompleteWith(forger, lease, {ChunkOf(lease, 0, 0, 3)}), INVALID_ARGUMENT,
                    "record 2 (custom_id 'r2') is not answered");
  Task task = StoreTask(job.id(), 0);
  EXPECT_EQ(task.state, TaskState::kPending);
  EXPECT_EQ(task.failures, 1);
  EXPECT_THAT(task.chunks, IsEmpty());
  EXPECT_THAT(task.last_error, HasSubstr("refused chunk 0 of attempt 1"));
  // Its later reports about that attempt are refused as stale.
  EXPECT_GRPC_ERROR(CompleteWith(forger, lease, {ChunkOf(lease, 0, 0, 3)}), FAILED_PRECONDITION, "");
  v1::Job done = FinishHonestly(job.id());
  EXPECT_EQ(done.request_counts().completed(), 6);
  ExpectEveryRecordOnceAndHonest(done, 6);
}

// Every shape of forgery is refused, each with a message that says what is wrong.
TEST_F(AttackTest, EveryShapeOfForgedChunkIsRefused) {
  StartServer();
  struct Forgery {
    std::string name, output, errors;
    int64_t claimed_failed;
    std::string phrase;
  };
  std::string err_r1 = DumpJson(MakeErrorLine("r1", "invalid_request", "no")) + "\n";
  std::vector<Forgery> forgeries = {
      {"a line too many", Answers({"r0", "r1", "r2", "r2"}, "forged"), "", 0, "holds 4 output and 0 error lines for its 3"},
      {"a line too few", Answers({"r0", "r1"}, "forged"), "", 0, "holds 2 output and 0 error lines for its 3"},
      {"out of order", Answers({"r1", "r0", "r2"}, "forged"), "", 0, "record 0 (custom_id 'r0') is not answered"},
      {"not JSON", "forged\nforged\nforged\n", "", 0, "output line 1 is not a JSON object"},
      {"an error in the output", Answers({"r0", "r2"}, "forged") + err_r1, "", 0, "output line 3 is an error line"},
      {"failed count contradicted", Answers({"r0", "r2"}, "forged"), err_r1, 0, "claims 0 failed records but holds 1"},
      {"a success in the error file", Answers({"r0", "r2"}, "forged"), Answer("r1", "forged"), 1, "error line 1 is not an error"},
      {"no custom_id", R"({"response":{"body":"forged"},"error":null})" "\n" + Answers({"r1", "r2"}, "forged"), "", 0,
       "record 0 (custom_id 'r0') is not answered: output line 1 answers no custom_id"},
  };
  for (const Forgery& f : forgeries) {
    SCOPED_TRACE(f.name);
    ExpectForgedChunkRefused("forger-" + f.name, f.output, f.errors, f.claimed_failed, f.phrase);
  }
}

// A checkpoint reported in a heartbeat is checked before it is committed: a forged one is never
// committed, the executor is told to stop, and the next attempt starts from the last good chunk.
TEST_F(AttackTest, AForgedCheckpointIsNotCommittedAndTheGoodOnesBeforeItStay) {
  StartServer();
  auto [job, forger, lease] = SubmitAndLeaseOne(6, 6, "forger");
  // Chunk 0 (r0, r1) is honest and committed; chunk 1 (r2, r3) is forged.
  WriteUrl(lease.chunk_urls(0).output_url(), Answers({"r0", "r1"}));
  v1::HeartbeatResponse first = Beat(forger, lease, 2, {ChunkOf(lease, 0, 0, 2)});
  EXPECT_THAT(first.cancel(), IsEmpty());
  EXPECT_EQ(CommittedRecords(StoreTask(job.id(), 0)), 2);
  WriteUrl(lease.chunk_urls(1).output_url(), Answers({"r2", "r2"}, "forged"));
  v1::HeartbeatResponse second = Beat(forger, lease, 4, {ChunkOf(lease, 0, 0, 2), ChunkOf(lease, 1, 2, 4)});
  ASSERT_EQ(second.cancel_size(), 1);
  EXPECT_EQ(second.cancel(0).task_index(), 0);
  Task task = StoreTask(job.id(), 0);
  EXPECT_EQ(task.state, TaskState::kPending);
  EXPECT_EQ(CommittedRecords(task), 2);  // the good chunk stays; the forged one was never committed
  EXPECT_EQ(task.failures, 1);
  // The honest attempt resumes after r1.
  std::string honest = RegisterExecutor("honest");
  fake_clock_.Advance(absl::Minutes(10));
  v1::TaskLease again = MustLeaseOne(honest);
  EXPECT_EQ(again.resume_from(), 2);
  WriteUrl(again.chunk_urls(0).output_url(), Answers({"r2", "r3", "r4", "r5"}));
  ASSERT_GRPC_OK(CompleteWith(honest, again, {ChunkOf(again, 0, 2, 6)}));
  ExpectEveryRecordOnceAndHonest(WaitForState(job.id(), "completed"), 6);
}

// A chunk object larger than the server's limit fails its attempt unread past the limit.
TEST_F(AttackTest, AnOversizedChunkFailsItsAttempt) {
  ServerOptions options = Options();
  options.max_chunk_bytes = 4096;
  StartServer(&fake_clock_, options);
  // The right custom_ids, padded to 30 KB.
  ExpectForgedChunkRefused("big", Answers({"r0", "r1", "r2"}, std::string(10000, 'x')), "", 0, "larger than 4096 bytes");
}

// A chunk rewritten after it was checked and committed (its write URL is still valid) is not
// published: its records become output_rejected error lines; every other record is served.
TEST_F(AttackTest, AChunkRewrittenAfterItsCommitIsNotPublished) {
  StartServer();
  v1::Job job = MustSubmit(Records(6), 3);
  std::string sly = RegisterExecutor("sly");
  std::vector<v1::TaskLease> leases = MustLease(sly, 2);
  ASSERT_EQ(leases.size(), 2u);
  ASSERT_EQ(leases[0].ref().task_index(), 0);
  // Task 0 is served honestly and its chunk checked and committed...
  auto [done0, failed0] = Serve(leases[0]);
  ASSERT_GRPC_OK(Complete(sly, leases[0].ref(), done0, failed0));
  EXPECT_EQ(StoreTask(job.id(), 0).state, TaskState::kSucceeded);
  // ... then rewritten through its still valid URL, before the last task makes the job final.
  WriteUrl(leases[0].chunk_urls(0).output_url(), Answers({"r0", "r1", "r1"}, "forged"));
  auto [done1, failed1] = Serve(leases[1]);
  ASSERT_GRPC_OK(Complete(sly, leases[1].ref(), done1, failed1));
  v1::Job done = WaitForState(job.id(), "completed");
  auto [status, output] = Results(job.id());
  ASSERT_TRUE(status.ok());
  auto [error_status, errors] = Results(job.id(), true);
  ASSERT_TRUE(error_status.ok());
  EXPECT_THAT(output, Not(HasSubstr("forged")));
  std::map<std::string, int> seen;
  for (const std::string& id : CustomIds(output)) ++seen[id];
  for (const std::string& id : CustomIds(errors)) ++seen[id];
  for (int i = 0; i < 6; ++i) EXPECT_EQ(seen[absl::StrCat("r", i)], 1) << "r" << i;
  EXPECT_THAT(CustomIds(output), ElementsAreArray({"r3", "r4", "r5"}));
  EXPECT_THAT(CustomIds(errors), ElementsAreArray({"r0", "r1", "r2"}));
  EXPECT_THAT(errors, HasSubstr("output_rejected"));
  (void)done;
}

}  // namespace
}  // namespace minions::testing

// TaskRun, the executor's core, as plain code: no runner, no server, no clock — a lease, its
// input, and what a runner would say.

#include "executor/task_run.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "model/state_machines.h"
#include "runner/batch_record.h"

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

LeaseGrant Lease(int n, int urls = 8, int64_t resume_from = 0) {
  LeaseGrant lease;
  lease.ref = {"job-1", 3, 2};
  lease.n_records = n;
  lease.resume_from = resume_from;
  lease.model = "/m.gguf";
  for (int k = 0; k < urls; ++k) lease.chunk_urls.push_back({absl::StrCat("out/", k), absl::StrCat("err/", k)});
  return lease;
}

std::string Input(int n) {
  std::string input;
  for (int i = 0; i < n; ++i) absl::StrAppend(&input, "{\"custom_id\":\"r", i, "\",\"prompt\":\"x\"}\n");
  return input;
}

Json Ok(int i) { return MakeResponseLine(absl::StrCat("r", i), Json::object()); }
Json Bad(int i) { return MakeErrorLine(absl::StrCat("r", i), "invalid_request", "no"); }

TaskRun::Options Every(int64_t records) {
  TaskRun::Options options;
  options.checkpoint_records = records;
  options.checkpoint_interval = absl::Hours(1);
  return options;
}

std::unique_ptr<TaskRun> Start(const LeaseGrant& lease, const std::string& input, TaskRun::Options options = {}) {
  auto run = TaskRun::Start(lease, input, options, kT0);
  EXPECT_TRUE(run.ok()) << run.status();
  return run.ok() ? std::move(*run) : nullptr;
}

// Answers the records of `batch` with ok lines, except those listed in `bad`.
void Answer(TaskRun& run, const TaskRun::Batch& batch, std::vector<size_t> bad = {}) {
  for (size_t i = 0; i < batch.records.size(); ++i) {
    int record = std::stoi(ParseRecordLine(batch.records[i]).custom_id.substr(1));
    bool is_bad = std::find(bad.begin(), bad.end(), i) != bad.end();
    run.OnResult(batch.id, i, is_bad ? Bad(record) : Ok(record));
  }
}

TEST(TaskRun, ALeaseWhoseInputDoesNotHoldItsRecordsIsRefused) {
  auto run = TaskRun::Start(Lease(5), Input(4), {}, kT0);
  EXPECT_TRUE(absl::IsDataLoss(run.status())) << run.status();
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("holds 4 records, the task 5"));
}

TEST(TaskRun, ALeaseThatResumesOutsideItsTaskOrHasNowhereToWriteIsRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(TaskRun::Start(Lease(4, 8, 5), Input(4), {}, kT0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TaskRun::Start(Lease(4, 8, -1), Input(4), {}, kT0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TaskRun::Start(Lease(4, 0), Input(4), {}, kT0).status()));
}

TEST(TaskRun, RunsEveryRecordOnceAndReportsTheWholeTaskDone) {
  auto run = Start(Lease(4), Input(4));
  auto batch = run->NextBatch(kT0);
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->id, "job-1/3#2");
  EXPECT_EQ(batch->records.size(), 4u);
  EXPECT_TRUE(run->in_runner());
  Answer(*run, *batch, {2});
  run->OnResult(batch->id, 0, Bad(0));     // a repeat: the first line stands
  run->OnResult("job-1/3#2.7", 1, Bad(1));  // another batch's
  run->OnResult(batch->id, 9, Bad(9));     // out of range
  EXPECT_EQ(run->OnBatchDone(batch->id, false), TaskRun::BatchEnd::kFinished);
  auto last = run->FinalChunk();
  ASSERT_TRUE(last.ok() && *last);
  EXPECT_EQ((*last)->chunk, (Chunk{2, 0, 0, 4, 1}));
  EXPECT_EQ((*last)->urls.output_url, "out/0");
  EXPECT_EQ(std::count((*last)->output.begin(), (*last)->output.end(), '\n'), 3);
  EXPECT_THAT((*last)->errors, HasSubstr("\"r2\""));
  EXPECT_FALSE(run->uploaded());
  run->ChunkUploaded((*last)->chunk, kT0);
  EXPECT_TRUE(run->uploaded());
  LeaseProgress done = run->Completion();
  EXPECT_EQ(done.records_done, 4);
  EXPECT_EQ(done.records_failed, 1);
  EXPECT_THAT(done.chunks, ElementsAre(Chunk{2, 0, 0, 4, 1}));
  EXPECT_FALSE(run->NextBatch(kT0)) << "nothing is left to run";
}

TEST(TaskRun, RecordsTheRunnerLeftOutBecomeErrorLines) {
  auto run = Start(Lease(3), Input(3));
  auto batch = run->NextBatch(kT0);
  run->OnResult(batch->id, 1, Ok(1));
  EXPECT_EQ(run->OnBatchDone(batch->id, false), TaskRun::BatchEnd::kFinished);
  auto last = run->FinalChunk();
  ASSERT_TRUE(last.ok() && *last);
  EXPECT_EQ((*last)->chunk.records_failed, 2);
  EXPECT_THAT((*last)->errors, HasSubstr("the runner gave no result for this record"));
}

TEST(TaskRun, ACancelledBatchIsNotFinished) {
  auto run = Start(Lease(3), Input(3));
  auto batch = run->NextBatch(kT0);
  EXPECT_EQ(run->OnBatchDone("someone-else", false), TaskRun::BatchEnd::kIgnored);
  EXPECT_EQ(run->OnBatchDone(batch->id, true), TaskRun::BatchEnd::kCancelled);
  EXPECT_FALSE(run->in_runner());
}

TEST(TaskRun, ChecksTheFinishedPrefixEveryFewRecordsAndKeepsTheLastUrlForTheEnd) {
  auto run = Start(Lease(10, 3), Input(10), Every(3));
  auto batch = run->NextBatch(kT0);
  // Out of order: 1 and 2 finish, then 0: the prefix [0, 3) is due.
  run->OnResult(batch->id, 1, Ok(1));
  run->OnResult(batch->id, 2, Ok(2));
  EXPECT_FALSE(run->DueCheckpoint(kT0)) << "record 0 has no line yet";
  run->OnResult(batch->id, 0, Ok(0));
  auto first = run->DueCheckpoint(kT0);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->chunk, (Chunk{2, 0, 0, 3, 0}));
  run->ChunkUploaded(first->chunk, kT0);
  for (int i = 3; i < 6; ++i) run->OnResult(batch->id, i, Ok(i));
  auto second = run->DueCheckpoint(kT0);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->chunk, (Chunk{2, 1, 3, 6, 0}));
  EXPECT_EQ(second->urls.output_url, "out/1");
  run->ChunkUploaded(second->chunk, kT0);
  for (int i = 6; i < 9; ++i) run->OnResult(batch->id, i, Ok(i));
  EXPECT_FALSE(run->DueCheckpoint(kT0)) << "the third and last URL pair is kept for the final chunk";
  run->OnResult(batch->id, 9, Ok(9));
  EXPECT_EQ(run->OnBatchDone(batch->id, false), TaskRun::BatchEnd::kFinished);
  auto last = run->FinalChunk();
  ASSERT_TRUE(last.ok() && *last);
  EXPECT_EQ((*last)->chunk, (Chunk{2, 2, 6, 10, 0}));
  EXPECT_EQ(run->Progress().records_done, 10);
  EXPECT_EQ(run->Progress().chunks.size(), 2u) << "the final chunk is not uploaded yet";
}

TEST(TaskRun, ChecksTheFinishedPrefixAfterAnIntervalEvenWithFewRecords) {
  TaskRun::Options options;
  options.checkpoint_records = 100;
  options.checkpoint_interval = absl::Seconds(30);
  auto run = Start(Lease(10), Input(10), options);
  auto batch = run->NextBatch(kT0);
  run->OnResult(batch->id, 0, Ok(0));
  EXPECT_FALSE(run->DueCheckpoint(kT0 + absl::Seconds(29)));
  auto due = run->DueCheckpoint(kT0 + absl::Seconds(30));
  ASSERT_TRUE(due);
  EXPECT_EQ(due->chunk.end, 1);
}

TEST(TaskRun, AResumedAttemptRunsOnlyTheRecordsAfterTheCommittedOnes) {
  auto run = Start(Lease(6, 8, 4), Input(6));
  EXPECT_EQ(run->Progress().records_done, 4) << "the committed records count as done";
  auto batch = run->NextBatch(kT0);
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->records.size(), 2u);
  EXPECT_EQ(ParseRecordLine(batch->records[0]).custom_id, "r4");
  Answer(*run, *batch);
  EXPECT_EQ(run->OnBatchDone(batch->id, false), TaskRun::BatchEnd::kFinished);
  auto last = run->FinalChunk();
  ASSERT_TRUE(last.ok() && *last);
  EXPECT_EQ((*last)->chunk, (Chunk{2, 0, 4, 6, 0}));
}

// Attempt 1 had every record committed (its last chunk went in with a heartbeat) but lost its lease
// before its completion arrived (a loaded machine). Attempt 2 resumes at the task's end: it
// uploads nothing, and its completion, with no chunk of its own, is one the server's rules accept.
// (It used to send an empty chunk [4, 4), which they refuse: every later attempt was refused in
// turn, each lease ran out and counted as a failure, and the task failed.)
TEST(TaskRun, AnAttemptThatResumesAtItsEndUploadsNothingAndItsCompletionIsAccepted) {
  auto run = Start(Lease(4, 8, 4), Input(4));
  EXPECT_FALSE(run->NextBatch(kT0));
  auto last = run->FinalChunk();
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_FALSE(last->has_value());
  EXPECT_TRUE(run->uploaded());
  LeaseProgress completion = run->Completion();
  EXPECT_EQ(completion.records_done, 4);
  EXPECT_THAT(completion.chunks, ::testing::IsEmpty());

  Task task;
  task.job_id = "job-1";
  task.index = 3;
  task.n_records = 4;
  task.state = TaskState::kRunning;
  task.attempt = 2;
  task.chunks = {Chunk{1, 0, 0, 3, 0}, Chunk{1, 1, 3, 4, 1}};
  ASSERT_TRUE(CompleteTask(task, completion, kT0).ok());
  EXPECT_EQ(task.state, TaskState::kSucceeded);
  EXPECT_EQ(task.records_failed, 1);
  EXPECT_EQ(task.chunks.size(), 2u);
}

TEST(TaskRun, APoisonRecordIsFoundByHalvingAndBecomesAnErrorLine) {
  // Record 5 of 8 kills the runner whenever it is run.
  auto run = Start(Lease(8), Input(8));
  auto batch = run->NextBatch(kT0);
  for (int i = 0; i < 2; ++i) run->OnResult(batch->id, i, Ok(i));  // then the crash
  // With others in the runner, whose record it was is unknown: the batch runs again, alone.
  ASSERT_TRUE(run->OnRunnerCrashed(/*alone=*/false, "killed by signal 6"));
  EXPECT_TRUE(run->suspect());
  std::vector<std::vector<std::string>> runs;
  int crashes = 1;
  while (auto next = run->NextBatch(kT0)) {
    std::vector<std::string> ids;
    for (const auto& r : next->records) ids.push_back(ParseRecordLine(r).custom_id);
    runs.push_back(ids);
    bool poison = std::find(ids.begin(), ids.end(), "r5") != ids.end();
    if (poison) {
      for (size_t i = 0; i < ids.size() && ids[i] != "r5"; ++i) run->OnResult(next->id, i, Ok(std::stoi(ids[i].substr(1))));
      ASSERT_TRUE(run->OnRunnerCrashed(/*alone=*/true, "killed by signal 6"));
      ++crashes;
      continue;
    }
    Answer(*run, *next);
    TaskRun::BatchEnd end = run->OnBatchDone(next->id, false);
    if (end == TaskRun::BatchEnd::kFinished) break;
    ASSERT_EQ(end, TaskRun::BatchEnd::kRunAgain);
  }
  EXPECT_EQ(runs.front(), (std::vector<std::string>{"r2", "r3", "r4", "r5", "r6", "r7"}));
  EXPECT_EQ(run->crashes(), crashes);
  EXPECT_LE(crashes, 5) << "halving finds one record of six in a few crashes";
  auto last = run->FinalChunk();
  ASSERT_TRUE(last.ok() && *last);
  EXPECT_EQ((*last)->chunk.records_failed, 1);
  EXPECT_THAT((*last)->errors, HasSubstr("\"r5\""));
  EXPECT_THAT((*last)->errors, HasSubstr("runner_crashed"));
  EXPECT_EQ(std::count((*last)->output.begin(), (*last)->output.end(), '\n'), 7);
}

TEST(TaskRun, AnAttemptThatCrashesTooOftenIsGivenUp) {
  TaskRun::Options options;
  options.max_crashes = 2;
  auto run = Start(Lease(4), Input(4), options);
  for (int crash = 1; crash <= 2; ++crash) {
    auto batch = run->NextBatch(kT0);
    ASSERT_TRUE(batch);
    EXPECT_TRUE(run->OnRunnerCrashed(false, "boom")) << crash;
  }
  run->NextBatch(kT0);
  EXPECT_FALSE(run->OnRunnerCrashed(false, "boom"));
}

TEST(TaskRun, ARunnerLostForTheOwnerBlamesNoRecord) {
  auto run = Start(Lease(4), Input(4));
  auto batch = run->NextBatch(kT0);
  run->OnResult(batch->id, 0, Ok(0));
  run->OnRunnerGone();
  EXPECT_FALSE(run->suspect());
  EXPECT_EQ(run->crashes(), 0);
  auto again = run->NextBatch(kT0);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->id, "job-1/3#2.1");
  EXPECT_EQ(again->records.size(), 3u) << "the finished record stays done";
}

// A run of four records whose runner crashed on the first batch: a suspect that halves, {r0, r1}
// then {r2, r3}; `*first`: its first half, handed out. Null where it is not so.
std::unique_ptr<TaskRun> HalvingSuspect(std::optional<TaskRun::Batch>* first) {
  auto run = Start(Lease(4), Input(4));
  run->NextBatch(kT0);
  if (!run->OnRunnerCrashed(true, "boom")) {
    ADD_FAILURE() << "the crash did not make the run a suspect";
    return nullptr;
  }
  *first = run->NextBatch(kT0);
  if (!*first) {
    ADD_FAILURE() << "no batch after the crash";
    return nullptr;
  }
  EXPECT_EQ((*first)->records.size(), 2u);
  return (*first)->records.size() == 2u ? std::move(run) : nullptr;
}

TEST(TaskRun, ASuspectLostForTheOwnerKeepsItsIsolationOrder) {
  std::optional<TaskRun::Batch> first;
  auto run = HalvingSuspect(&first);
  ASSERT_TRUE(run);
  run->OnRunnerGone();
  auto again = run->NextBatch(kT0);
  ASSERT_EQ(again->records.size(), 2u);
  EXPECT_EQ(ParseRecordLine(again->records[0]).custom_id, "r0");
}

// The owner came back mid-batch (issue 41, point 6): the batch is cancelled at the runner's next
// decode step. What it finished stays done; the `cancelled` lines it writes for the rest are no
// answers: those records run again in the next batch.
TEST(TaskRun, ABatchYieldedForTheOwnerKeepsWhatFinishedAndRunsTheRestAgain) {
  auto run = Start(Lease(4), Input(4), Every(50));
  auto batch = run->NextBatch(kT0);
  run->OnResult(batch->id, 1, Ok(1));
  run->OnResult(batch->id, 0, Ok(0));
  run->Yield();
  EXPECT_TRUE(run->yielding());
  for (size_t i : {2, 3}) {
    run->OnResult(batch->id, i, MakeErrorLine(absl::StrCat("r", i), kErrorCancelled, "the batch was cancelled"));
  }
  EXPECT_EQ(run->OnBatchDone(batch->id, true), TaskRun::BatchEnd::kYielded);
  EXPECT_FALSE(run->in_runner());
  EXPECT_TRUE(run->yielded());
  EXPECT_EQ(run->Progress().records_done, 2);
  EXPECT_EQ(run->Progress().records_failed, 0) << "a record stopped for the owner is no error";
  EXPECT_EQ(run->crashes(), 0);

  // Checkpointed at once, whatever the cadence: a stop may follow the pause.
  EXPECT_FALSE(run->DueCheckpoint(kT0));
  auto chunk = run->DueCheckpoint(kT0, /*now_anyway=*/true);
  ASSERT_TRUE(chunk);
  EXPECT_EQ(chunk->chunk.begin, 0);
  EXPECT_EQ(chunk->chunk.end, 2);
  run->ChunkUploaded(chunk->chunk, kT0);

  auto again = run->NextBatch(kT0);
  ASSERT_TRUE(again);
  EXPECT_FALSE(run->yielded());
  ASSERT_EQ(again->records.size(), 2u);
  EXPECT_EQ(ParseRecordLine(again->records[0]).custom_id, "r2");
  EXPECT_EQ(ParseRecordLine(again->records[1]).custom_id, "r3");
  Answer(*run, *again);
  EXPECT_EQ(run->OnBatchDone(again->id, false), TaskRun::BatchEnd::kFinished);
  auto last = run->FinalChunk();
  ASSERT_TRUE(last.ok() && *last);
  EXPECT_EQ((*last)->chunk.begin, 2);
  EXPECT_EQ((*last)->chunk.records_failed, 0);
  EXPECT_THAT((*last)->output, ::testing::Not(HasSubstr("cancelled")));
}

// The batch ended before the cancel reached the runner: it is simply finished.
TEST(TaskRun, ABatchThatEndsBeforeItsYieldReachesTheRunnerIsFinished) {
  auto run = Start(Lease(2), Input(2));
  auto batch = run->NextBatch(kT0);
  run->Yield();
  Answer(*run, *batch);
  EXPECT_EQ(run->OnBatchDone(batch->id, false), TaskRun::BatchEnd::kFinished);
  EXPECT_FALSE(run->yielded());
  EXPECT_EQ(run->Progress().records_done, 2);
}

// A suspect (isolating a poison record) yielded for the owner keeps its group's place.
TEST(TaskRun, ASuspectYieldedForTheOwnerKeepsItsIsolationOrder) {
  std::optional<TaskRun::Batch> first;
  auto run = HalvingSuspect(&first);
  ASSERT_TRUE(run);
  run->Yield();
  run->OnResult(first->id, 0, MakeErrorLine("r0", kErrorCancelled, "the batch was cancelled"));
  run->OnResult(first->id, 1, MakeErrorLine("r1", kErrorCancelled, "the batch was cancelled"));
  EXPECT_EQ(run->OnBatchDone(first->id, true), TaskRun::BatchEnd::kYielded);
  auto again = run->NextBatch(kT0);
  ASSERT_EQ(again->records.size(), 2u);
  EXPECT_EQ(ParseRecordLine(again->records[0]).custom_id, "r0");
  EXPECT_EQ(run->Progress().records_done, 0);
}

TEST(TaskRun, ProgressChangesItsVersionOnlyWhenItMoves) {
  auto run = Start(Lease(3), Input(3));
  uint64_t v = run->version();
  auto batch = run->NextBatch(kT0);
  EXPECT_EQ(run->version(), v) << "sending a batch is no progress";
  run->OnResult(batch->id, 0, Ok(0));
  EXPECT_GT(run->version(), v);
  v = run->version();
  run->OnResult(batch->id, 0, Ok(0));
  EXPECT_EQ(run->version(), v);
  LeaseProgress progress = run->Progress();
  EXPECT_EQ(progress.job_id, "job-1");
  EXPECT_EQ(progress.task_index, 3);
  EXPECT_EQ(progress.attempt, 2);
  EXPECT_EQ(progress.records_done, 1);
}

}  // namespace
}  // namespace minions

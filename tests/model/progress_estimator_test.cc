// The progress estimate: records done count what running attempts have done, the rate is recent,
// the ETA follows the rate. Time is an absl::Time the tests move.

#include "model/progress_estimator.h"

#include <gtest/gtest.h>

namespace minions {
namespace {

constexpr int64_t kTotal = 1000;

class ProgressEstimatorTest : public ::testing::Test {
 protected:
  // A job of kTotal records that started at `start_`.
  Job Running(int64_t completed, int64_t failed = 0, int64_t total = kTotal) {
    Job job;
    job.id = "job-000000000001";
    job.state = JobState::kRunning;
    job.counts.total = total;
    job.counts.completed = completed;
    job.counts.failed = failed;
    job.started_at = start_;
    return job;
  }

  const absl::Time start_ = absl::FromUnixSeconds(1'700'000'000);
  absl::Time now_ = start_;
};

TEST_F(ProgressEstimatorTest, RecordsOfRunningAttemptsCountBeforeTheirTasksEnd) {
  ProgressEstimator estimator;
  now_ += absl::Seconds(10);
  // No task has ended, but running attempts have done 175 records between them.
  ProgressEstimate e = estimator.Observe(Running(0), 175, now_);
  EXPECT_EQ(e.finished, 0);
  EXPECT_EQ(e.in_flight, 175);
  EXPECT_EQ(e.done, 175);
  EXPECT_DOUBLE_EQ(e.fraction, 0.175);
  // Then each heartbeat moves it on, record by record.
  now_ += absl::Seconds(1);
  EXPECT_EQ(estimator.Observe(Running(0), 176, now_).done, 176);
  // A task ends: its records move from in flight to finished, the total does not jump.
  now_ += absl::Seconds(1);
  e = estimator.Observe(Running(100, 2), 77, now_);
  EXPECT_EQ(e.finished, 102);
  EXPECT_EQ(e.done, 179);
}

TEST_F(ProgressEstimatorTest, AYoungJobsRateIsItsAverageSinceItStarted) {
  ProgressEstimator estimator(absl::Seconds(60));
  now_ += absl::Seconds(20);
  ProgressEstimate e = estimator.Observe(Running(0), 200, now_);  // first sight: 200 in 20 s
  EXPECT_DOUBLE_EQ(e.records_per_second, 10);
  EXPECT_DOUBLE_EQ(e.eta_seconds, 80);
  now_ += absl::Seconds(10);
  e = estimator.Observe(Running(0), 300, now_);
  EXPECT_DOUBLE_EQ(e.records_per_second, 10);
}

TEST_F(ProgressEstimatorTest, TheRateIsOverTheLastWindowNotSinceTheStart) {
  ProgressEstimator estimator(absl::Seconds(60));
  // Ten slow minutes: 1 record a second, sampled every 10 s.
  int64_t done = 0;
  for (int i = 0; i < 60; ++i) {
    now_ += absl::Seconds(10);
    done += 10;
    estimator.Observe(Running(0, 0, 10000), done, now_);
  }
  // Then it runs ten times faster (more executors joined) for a minute and a half.
  ProgressEstimate e;
  for (int i = 0; i < 9; ++i) {
    now_ += absl::Seconds(10);
    done += 100;
    e = estimator.Observe(Running(0, 0, 10000), done, now_);
  }
  EXPECT_DOUBLE_EQ(e.records_per_second, 10) << "the average since the start would be "
                                               << static_cast<double>(done) / absl::ToDoubleSeconds(now_ - start_);
}

TEST_F(ProgressEstimatorTest, TheEtaIsWhatIsLeftAtTheRecentRate) {
  ProgressEstimator estimator(absl::Seconds(60));
  estimator.Observe(Running(0), 0, now_);  // started, nothing done
  now_ += absl::Seconds(60);
  ProgressEstimate e = estimator.Observe(Running(400), 100, now_);  // 500 in a minute
  EXPECT_DOUBLE_EQ(e.records_per_second, 500.0 / 60);
  EXPECT_DOUBLE_EQ(e.eta_seconds, 60);
}

TEST_F(ProgressEstimatorTest, NothingDoneYetHasNoEta) {
  ProgressEstimator estimator;
  Job queued = Running(0);
  queued.state = JobState::kQueued;
  queued.started_at.reset();
  ProgressEstimate e = estimator.Observe(queued, 0, now_);
  EXPECT_EQ(e.records_per_second, 0);
  EXPECT_EQ(e.eta_seconds, -1);
  now_ += absl::Minutes(5);
  EXPECT_EQ(estimator.Observe(queued, 0, now_).eta_seconds, -1);
}

TEST_F(ProgressEstimatorTest, AnEndedJobHasNoEtaLeftAndItsWholeRunsRate) {
  ProgressEstimator estimator;
  Job done = Running(990, 10);
  done.state = JobState::kCompleted;
  done.finished_at = start_ + absl::Seconds(100);
  ProgressEstimate e = estimator.Observe(done, 55, start_ + absl::Hours(1));
  EXPECT_EQ(e.in_flight, 0);
  EXPECT_EQ(e.done, kTotal);
  EXPECT_DOUBLE_EQ(e.fraction, 1);
  EXPECT_EQ(e.eta_seconds, 0);
  EXPECT_DOUBLE_EQ(e.records_per_second, 10);
}

TEST_F(ProgressEstimatorTest, AJobWhoseRecordsAreAllDoneIsDueNow) {
  ProgressEstimator estimator;
  Job finalizing = Running(1000);
  finalizing.state = JobState::kFinalizing;
  now_ += absl::Seconds(10);
  EXPECT_EQ(estimator.Observe(finalizing, 0, now_).eta_seconds, 0);
}

TEST_F(ProgressEstimatorTest, DoneNeverPassesTheTotalNorTheRateZero) {
  ProgressEstimator estimator(absl::Seconds(60));
  now_ += absl::Seconds(10);
  EXPECT_EQ(estimator.Observe(Running(990), 40, now_).done, kTotal);  // a backup attempt counts twice
  // An attempt fails: its records are no longer in flight. Done goes back; the rate is not negative.
  now_ += absl::Minutes(2);
  estimator.Observe(Running(500), 100, now_);
  now_ += absl::Minutes(2);
  ProgressEstimate e = estimator.Observe(Running(500), 0, now_);
  EXPECT_EQ(e.done, 500);
  EXPECT_EQ(e.records_per_second, 0);
  EXPECT_EQ(e.eta_seconds, -1);
}

TEST(ProgressTracker, EveryReaderFeedsAndReadsTheSameSamples) {
  ProgressTracker tracker(absl::Seconds(60));
  Job job;
  job.id = "job-000000000002";
  job.state = JobState::kRunning;
  job.counts.total = 100;
  const absl::Time t0 = absl::FromUnixSeconds(1'700'000'000);
  job.started_at = t0;
  tracker.Observe(job, 0, t0);                                   // a dashboard refresh
  ProgressEstimate watch = tracker.Observe(job, 30, t0 + absl::Seconds(30));  // a watch stream
  EXPECT_DOUBLE_EQ(watch.records_per_second, 1);
  // It ends: answered, then forgotten (a new run of the same id would start afresh).
  job.state = JobState::kCompleted;
  job.counts.completed = 100;
  job.finished_at = t0 + absl::Seconds(100);
  EXPECT_EQ(tracker.Observe(job, 0, t0 + absl::Seconds(100)).eta_seconds, 0);
  job.state = JobState::kRunning;
  job.counts.completed = 0;
  job.started_at = t0 + absl::Seconds(200);
  EXPECT_DOUBLE_EQ(tracker.Observe(job, 10, t0 + absl::Seconds(210)).records_per_second, 1);
}

}  // namespace
}  // namespace minions

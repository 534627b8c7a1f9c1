// Attacks on spot checks (docs/verification.md, "Spot checks"): a producer that would vouch for
// its own answers, an executor that would judge a task it does not hold, a verdict that names
// records the task does not have. Each refusal leaves no verdict and no quarantine behind.

#include "secure_server.h"
#include "testing/status_checks.h"

namespace minions::testing {
namespace {

class SpotCheckAttack : public SecureServer {
 protected:
  void SetUp() override {
    SecureServer::SetUp();
    StoreOptions options;
    options.spot_checks = true;
    options.verification.all_until_records = 1000;  // every record of a new executor: certain draws
    store_ = Must(SqliteMetadataStore::Open(":memory:", options));
    ServerOptions server = Options();
    server.spot_checks = true;
    server.verify_wait = verify_wait_;
    StartServer(server);
    CreateTeam("search");
    submitter_ = Issue(Role::kSubmitter, "search", "alice");
  }

  std::vector<v1::VerificationLease> LeaseChecks(const Enrolled& executor) {
    v1::LeaseVerificationsRequest request;
    request.set_max_tasks(4);
    v1::LeaseVerificationsResponse reply;
    grpc::Status status = executors_->LeaseVerifications(As(executor.credential).get(), request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {reply.leases().begin(), reply.leases().end()};
  }

  static v1::ReportVerificationsRequest Report(const v1::VerificationLease& lease, bool passed) {
    v1::ReportVerificationsRequest request;
    *request.mutable_ref() = lease.ref();
    for (const v1::VerificationItem& item : lease.items()) {
      v1::RecordVerdict* verdict = request.add_verdicts();
      verdict->set_record(item.record());
      verdict->set_checked(true);
      verdict->set_passed(passed);
    }
    return request;
  }

  // A producer's finished two-record job and a verifier's lease on its spot check.
  struct Checked {
    v1::Job job;
    v1::VerificationLease lease;
  };
  Checked ProduceAndLease(const Enrolled& producer, const Enrolled& verifier) {
    Checked checked;
    checked.job = MustSubmit(submitter_, 2);
    std::vector<v1::TaskLease> leases = MustLease(producer, 1);
    EXPECT_THAT(leases, SizeIs(1));
    if (leases.empty()) return checked;
    grpc::Status completed = CompleteLease(producer, leases[0]);
    EXPECT_TRUE(completed.ok()) << completed.error_message();
    // The producer is never offered its own answers.
    EXPECT_THAT(LeaseChecks(producer), IsEmpty());
    std::vector<v1::VerificationLease> checks = LeaseChecks(verifier);
    EXPECT_THAT(checks, SizeIs(1));
    if (!checks.empty()) checked.lease = checks[0];
    return checked;
  }

  v1::Job GetJob(const std::string& id) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job job;
    grpc::Status status = jobs_->GetJob(As(submitter_).get(), request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  std::string submitter_;
  absl::Duration verify_wait_ = absl::Minutes(10);  // ServerOptions::verify_wait
};

// A server that waits for no spot check: a job publishes with its checks open.
class SpotCheckAfterPublication : public SpotCheckAttack {
 protected:
  SpotCheckAfterPublication() { verify_wait_ = absl::ZeroDuration(); }
};

TEST_F(SpotCheckAttack, AVerifierGetsTheRecordsAndTheAnswersAsTheServerReadThem) {
  Enrolled producer = Enrol("producer"), verifier = Enrol("verifier"), other = Enrol("other");
  Checked checked = ProduceAndLease(producer, verifier);
  const v1::VerificationLease& lease = checked.lease;
  EXPECT_EQ(lease.ref().job_id(), checked.job.id());
  EXPECT_EQ(lease.model(), model_);
  EXPECT_EQ(lease.runner(), "llama");
  ASSERT_THAT(lease.items(), SizeIs(2));
  for (int i = 0; i < 2; ++i) {
    const v1::VerificationItem& item = lease.items(i);
    EXPECT_EQ(item.record(), i);
    EXPECT_EQ(item.custom_id(), absl::StrCat("r", i));
    EXPECT_THAT(item.input_line(), HasSubstr(absl::StrCat("\"r", i, "\"")));
    EXPECT_THAT(item.output_line(), HasSubstr(absl::StrCat("\"r", i, "\"")));
  }
  // Held by the verifier: nobody else gets it meanwhile.
  EXPECT_THAT(LeaseChecks(other), IsEmpty());
}

TEST_F(SpotCheckAttack, OnlyTheHolderOfAVerificationLeaseReportsVerdicts) {
  Enrolled producer = Enrol("producer"), verifier = Enrol("verifier"), other = Enrol("other");
  Checked checked = ProduceAndLease(producer, verifier);
  ASSERT_THAT(checked.lease.items(), SizeIs(2));
  v1::ReportVerificationsResponse reply;
  const v1::ReportVerificationsRequest passed = Report(checked.lease, true);
  const v1::ReportVerificationsRequest failed = Report(checked.lease, false);

  EXPECT_GRPC_CODE(executors_->ReportVerifications(As("").get(), failed, &reply), UNAUTHENTICATED);
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(admin_).get(), failed, &reply), PERMISSION_DENIED);
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(submitter_).get(), failed, &reply), PERMISSION_DENIED);
  // The producer vouching for itself, or another executor holding no lease on the task.
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(producer.credential).get(), passed, &reply), PERMISSION_DENIED);
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(other.credential).get(), failed, &reply), PERMISSION_DENIED);
  // The holder's credential naming another executor.
  v1::ReportVerificationsRequest posing = failed;
  posing.set_executor_id(other.id);
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(verifier.credential).get(), posing, &reply), PERMISSION_DENIED);
  // The holder, with verdicts that are not one per record of the task, in its order.
  v1::ReportVerificationsRequest fewer = failed;
  fewer.mutable_verdicts()->RemoveLast();
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(verifier.credential).get(), fewer, &reply), INVALID_ARGUMENT);
  v1::ReportVerificationsRequest elsewhere = failed;
  elsewhere.mutable_verdicts(0)->set_record(1);
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(verifier.credential).get(), elsewhere, &reply),
                   INVALID_ARGUMENT);
  v1::ReportVerificationsRequest unknown = failed;
  unknown.mutable_ref()->set_seq(7);
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(verifier.credential).get(), unknown, &reply), NOT_FOUND);
  // None of it left a trace: no verdict, the task open, the producer in service.
  EXPECT_THAT(Must(store_->ListVerifications(checked.job.id())), IsEmpty());
  EXPECT_EQ(Must(store_->CountOpenVerifications(checked.job.id())), 1);
  EXPECT_NE(Must(store_->GetExecutor(producer.id)).state, ExecutorState::kQuarantined);

  ASSERT_GRPC_OK(executors_->ReportVerifications(As(verifier.credential).get(), passed, &reply));
  std::vector<Verification> verdicts = Must(store_->ListVerifications(checked.job.id()));
  ASSERT_THAT(verdicts, SizeIs(2));
  EXPECT_EQ(verdicts[0].custom_id, "r0");  // the job's input names the records, not the verifier
  EXPECT_EQ(verdicts[1].custom_id, "r1");
  EXPECT_EQ(verdicts[0].verifier_id, verifier.id);
  EXPECT_TRUE(verdicts[0].passed && verdicts[1].passed);
  EXPECT_EQ(Must(store_->CountOpenVerifications(checked.job.id())), 0);
  // Reported once.
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(verifier.credential).get(), failed, &reply), NOT_FOUND);
}

TEST_F(SpotCheckAttack, AFailedVerdictQuarantinesTheProducer) {
  Enrolled producer = Enrol("producer"), verifier = Enrol("verifier");
  Checked checked = ProduceAndLease(producer, verifier);
  ASSERT_THAT(checked.lease.items(), SizeIs(2));
  v1::ReportVerificationsRequest report = Report(checked.lease, true);
  report.mutable_verdicts(1)->set_passed(false);
  report.mutable_verdicts(1)->set_reason("greedy: answer token 2 is 8.4 nats below the most likely token");
  v1::ReportVerificationsResponse reply;
  ASSERT_GRPC_OK(executors_->ReportVerifications(As(verifier.credential).get(), report, &reply));
  Executor quarantined = Must(store_->GetExecutor(producer.id));
  EXPECT_EQ(quarantined.state, ExecutorState::kQuarantined);
  EXPECT_THAT(quarantined.state_reason, HasSubstr("r1"));
  EXPECT_THAT(quarantined.state_reason, HasSubstr("8.4 nats"));
  MustSubmit(submitter_, 2);
  EXPECT_THAT(MustLease(producer, 1), IsEmpty());
}

TEST_F(SpotCheckAttack, AJobPublishesOnlyOnceItsSpotChecksHaveVerdicts) {
  Enrolled producer = Enrol("producer"), verifier = Enrol("verifier");
  Checked checked = ProduceAndLease(producer, verifier);
  ASSERT_THAT(checked.lease.items(), SizeIs(2));
  // Every task done, the spot check open: the job waits, however often the finaliser looks.
  ASSERT_OK(server_->SweepReadyJobs());
  ASSERT_OK(server_->FinalizeReportedJobs());
  EXPECT_EQ(StoreJob(checked.job.id()).state, JobState::kFinalizing);
  EXPECT_EQ(StoreJob(checked.job.id()).output_key, "");
  v1::ReportVerificationsResponse reply;
  ASSERT_GRPC_OK(executors_->ReportVerifications(As(verifier.credential).get(), Report(checked.lease, true), &reply));
  ASSERT_OK(server_->FinalizeReportedJobs());  // the last verdict made it ready
  ASSERT_OK(server_->SweepReadyJobs());
  Job published = StoreJob(checked.job.id());
  EXPECT_EQ(published.state, JobState::kCompleted);
  EXPECT_EQ(Tally(Must(store_->ListVerifications(checked.job.id()))).passed, 2);
}

TEST_F(SpotCheckAttack, AFailedVerdictSendsTheProducersRecordsToAnotherExecutorBeforeTheJobPublishes) {
  Enrolled producer = Enrol("producer"), verifier = Enrol("verifier");
  Checked checked = ProduceAndLease(producer, verifier);
  ASSERT_THAT(checked.lease.items(), SizeIs(2));
  v1::ReportVerificationsResponse reply;
  ASSERT_GRPC_OK(executors_->ReportVerifications(As(verifier.credential).get(), Report(checked.lease, false), &reply));
  ASSERT_OK(server_->FinalizeReportedJobs());
  ASSERT_OK(server_->SweepReadyJobs());
  EXPECT_EQ(StoreJob(checked.job.id()).state, JobState::kRunning);  // not published: redone first
  // The verifier (an honest executor) redoes the records; the redo gets its own spot check,
  // which the quarantined producer is not offered.
  std::vector<v1::TaskLease> redo = MustLease(verifier, 1);
  ASSERT_THAT(redo, SizeIs(1));
  EXPECT_EQ(redo[0].resume_from(), 0);
  ASSERT_GRPC_OK(CompleteLease(verifier, redo[0]));
  EXPECT_THAT(LeaseChecks(producer), IsEmpty());
  EXPECT_EQ(StoreJob(checked.job.id()).state, JobState::kFinalizing);
  EXPECT_EQ(Must(store_->CountOpenVerifications(checked.job.id())), 1);
}

// The verify wait over, a job publishes with its spot checks open and says so; a check that fails
// after publication still quarantines the producer, and the job's status names the record and
// how many of its records that producer wrote (the published files are not rewritten).
TEST_F(SpotCheckAfterPublication, AJobPublishedBeforeItsCheckFailedNamesTheRecordsNotRedone) {
  Enrolled producer = Enrol("producer"), verifier = Enrol("verifier");
  Checked checked = ProduceAndLease(producer, verifier);
  ASSERT_THAT(checked.lease.items(), SizeIs(2));
  ASSERT_OK(server_->FinalizeReportedJobs());
  ASSERT_OK(server_->SweepReadyJobs());
  v1::Job published = GetJob(checked.job.id());
  ASSERT_EQ(published.state(), "completed");
  EXPECT_EQ(published.verification().open_checks(), 1);
  EXPECT_THAT(published.verification().failed_after_publication(), IsEmpty());

  v1::ReportVerificationsRequest report = Report(checked.lease, true);
  report.mutable_verdicts(1)->set_passed(false);
  report.mutable_verdicts(1)->set_reason("greedy: answer token 0 is 9.1 nats below the most likely token");
  v1::ReportVerificationsResponse reply;
  ASSERT_GRPC_OK(executors_->ReportVerifications(As(verifier.credential).get(), report, &reply));
  EXPECT_EQ(Must(store_->GetExecutor(producer.id)).state, ExecutorState::kQuarantined);
  v1::Job after = GetJob(checked.job.id());
  EXPECT_EQ(after.state(), "completed");  // published files are not rewritten
  EXPECT_EQ(after.verification().open_checks(), 0);
  EXPECT_EQ(after.verification().failed(), 1);
  EXPECT_THAT(after.verification().failed_after_publication(), ::testing::ElementsAre("r1"));
  EXPECT_EQ(after.verification().records_of_quarantined(), 2);
}

// A failure before publication redoes the records: nothing is left to name afterwards.
TEST_F(SpotCheckAttack, AFailureBeforePublicationLeavesNoNoticeOnceTheRecordsAreRedone) {
  Enrolled producer = Enrol("producer"), verifier = Enrol("verifier");
  Checked checked = ProduceAndLease(producer, verifier);
  ASSERT_THAT(checked.lease.items(), SizeIs(2));
  v1::ReportVerificationsResponse reply;
  ASSERT_GRPC_OK(executors_->ReportVerifications(As(verifier.credential).get(), Report(checked.lease, false), &reply));
  std::vector<v1::TaskLease> redo = MustLease(verifier, 1);
  ASSERT_THAT(redo, SizeIs(1));
  ASSERT_GRPC_OK(CompleteLease(verifier, redo[0]));
  Enrolled third = Enrol("third");
  // The redo's spot check, and the arbitration of the verifier's failure (of the first attempt's
  // chunk), which holds no job back and is left open here.
  std::vector<v1::VerificationLease> checks = LeaseChecks(third);
  ASSERT_THAT(checks, SizeIs(2));
  const v1::VerificationLease& redone =
      checks[0].ref().attempt() == checked.lease.ref().attempt() ? checks[1] : checks[0];
  ASSERT_NE(redone.ref().attempt(), checked.lease.ref().attempt());
  ASSERT_GRPC_OK(executors_->ReportVerifications(As(third.credential).get(), Report(redone, true), &reply));
  ASSERT_OK(server_->FinalizeReportedJobs());
  ASSERT_OK(server_->SweepReadyJobs());
  v1::Job done = GetJob(checked.job.id());
  ASSERT_EQ(done.state(), "completed");
  EXPECT_GE(done.verification().failed(), 1);
  EXPECT_THAT(done.verification().failed_after_publication(), IsEmpty());
  EXPECT_EQ(done.verification().records_of_quarantined(), 0);
}

// A verifier that fails honest answers (to take honest executors out of service, or broken) is
// itself judged: a third executor re-scores the records it failed, with the producer's answers
// as the server read them. It passes them: the liar is the one quarantined, the producer is back
// in service (its redone records stay redone), and the liar's word is taken no more.
TEST_F(SpotCheckAttack, ALyingVerifierIsCaughtByArbitrationAndTheProducerReleased) {
  Enrolled producer = Enrol("producer"), liar = Enrol("liar"), arbiter = Enrol("arbiter");
  Checked checked = ProduceAndLease(producer, liar);
  ASSERT_THAT(checked.lease.items(), SizeIs(2));
  v1::ReportVerificationsRequest lie = Report(checked.lease, true);
  lie.mutable_verdicts(1)->set_passed(false);
  lie.mutable_verdicts(1)->set_reason("greedy: answer token 0 is 9.1 nats below the most likely token");
  v1::ReportVerificationsResponse reply;
  ASSERT_GRPC_OK(executors_->ReportVerifications(As(liar.credential).get(), lie, &reply));
  ASSERT_EQ(Must(store_->GetExecutor(producer.id)).state, ExecutorState::kQuarantined);
  EXPECT_EQ(StoreJob(checked.job.id()).state, JobState::kRunning);  // redone at once, as for any failure

  // Neither party is offered the dispute; the arbiter gets the record the liar failed.
  EXPECT_THAT(LeaseChecks(liar), IsEmpty());
  EXPECT_THAT(LeaseChecks(producer), IsEmpty());
  std::vector<v1::VerificationLease> disputes = LeaseChecks(arbiter);
  ASSERT_THAT(disputes, SizeIs(1));
  const v1::VerificationLease& dispute = disputes[0];
  EXPECT_EQ(dispute.ref().job_id(), checked.job.id());
  EXPECT_EQ(dispute.ref().attempt(), checked.lease.ref().attempt());
  EXPECT_EQ(dispute.ref().seq(), checked.lease.ref().seq());
  ASSERT_THAT(dispute.items(), SizeIs(1));
  EXPECT_EQ(dispute.items(0).custom_id(), "r1");
  EXPECT_EQ(dispute.items(0).output_line(), checked.lease.items(1).output_line());  // the producer's answer
  // The liar cannot report the arbitration of its own verdict.
  EXPECT_GRPC_CODE(executors_->ReportVerifications(As(liar.credential).get(), Report(dispute, false), &reply),
                   PERMISSION_DENIED);

  ASSERT_GRPC_OK(executors_->ReportVerifications(As(arbiter.credential).get(), Report(dispute, true), &reply));
  const Executor caught = Must(store_->GetExecutor(liar.id));
  EXPECT_EQ(caught.state, ExecutorState::kQuarantined);
  EXPECT_THAT(caught.state_reason, HasSubstr("arbitration"));
  EXPECT_THAT(caught.state_reason, HasSubstr(arbiter.id));
  EXPECT_EQ(Must(store_->GetExecutor(producer.id)).state, ExecutorState::kAvailable);
  // The producer works again (on its own redone records, here); the liar gets nothing.
  EXPECT_THAT(MustLease(producer, 1), SizeIs(1));
  MustSubmit(submitter_, 2);
  EXPECT_THAT(MustLease(liar, 1), IsEmpty());
  EXPECT_THAT(LeaseChecks(liar), IsEmpty());
}

// The arbiter fails the record too: the producer's quarantine stands, and the verifier stays in
// service.
TEST_F(SpotCheckAttack, AnArbiterThatAgreesWithTheVerifierKeepsTheProducerQuarantined) {
  Enrolled producer = Enrol("producer"), verifier = Enrol("verifier"), arbiter = Enrol("arbiter");
  Checked checked = ProduceAndLease(producer, verifier);
  ASSERT_THAT(checked.lease.items(), SizeIs(2));
  v1::ReportVerificationsResponse reply;
  ASSERT_GRPC_OK(executors_->ReportVerifications(As(verifier.credential).get(), Report(checked.lease, false), &reply));
  std::vector<v1::VerificationLease> disputes = LeaseChecks(arbiter);
  ASSERT_THAT(disputes, SizeIs(1));
  ASSERT_THAT(disputes[0].items(), SizeIs(2));
  ASSERT_GRPC_OK(executors_->ReportVerifications(As(arbiter.credential).get(), Report(disputes[0], false), &reply));
  const Executor upheld = Must(store_->GetExecutor(producer.id));
  EXPECT_EQ(upheld.state, ExecutorState::kQuarantined);
  EXPECT_THAT(upheld.state_reason, HasSubstr(arbiter.id));
  EXPECT_NE(Must(store_->GetExecutor(verifier.id)).state, ExecutorState::kQuarantined);
}

}  // namespace
}  // namespace minions::testing

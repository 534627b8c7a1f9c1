// Attacks on a team's own rules (docs/security.md 40.3 and 40.6a): the runners an admin allowed
// for the team's jobs, and the confined executors a job or its team requires. Each asserts the
// refusal and that nothing was created or leased in its place.

#include <functional>

#include "secure_server.h"
#include "server/proto_convert.h"

namespace minions::testing {
namespace {

class TeamRulesAttack : public SecureServer {
 protected:
  void SetUp() override {
    SecureServer::SetUp();
    ServerOptions options = Options();
    options.runner_allowlist = {"llama", "embed"};  // what executors may offer, for every team
    StartServer(options);
    CreateTeam("search");
    CreateTeam("ads");
    search_ = Issue(Role::kSubmitter, "search", "alice");
    ads_ = Issue(Role::kSubmitter, "ads", "eve");
  }
  // An admin's UpdateTeam of `team` with `change` applied to what it is now.
  grpc::Status ChangeTeam(const std::string& token, const std::string& team,
                          const std::function<void(v1::Team*)>& change) {
    v1::UpdateTeamRequest request;
    *request.mutable_team() = ToProto(Must(store_->GetTeam(team)));
    change(request.mutable_team());
    v1::Team reply;
    return admin_stub_->UpdateTeam(As(token).get(), request, &reply);
  }
  grpc::Status SubmitAs(const std::string& token, const std::string& runner, bool confined, v1::Job* job,
                        const std::string& team = "") {
    v1::SubmitJobRequest request = Request(4, team);
    request.set_runner(runner);
    request.set_require_confined(confined);
    return jobs_->SubmitJob(As(token).get(), request, job);
  }
  std::string search_, ads_;
};

// 40.3 per team: a team allowed only "llama" cannot send its prompts to another runner the server
// allows, whoever submits (its submitter, an admin on its behalf); another team is not bound by
// it; only an admin sets the list, and only to valid runner names.
TEST_F(TeamRulesAttack, ATeamsJobNamingARunnerNotAllowedForItIsRefused) {
  ASSERT_GRPC_OK(ChangeTeam(admin_, "search", [](v1::Team* t) { t->add_runners("llama"); }));
  v1::Job job;
  grpc::Status refused = SubmitAs(search_, "embed", false, &job);
  EXPECT_GRPC_CODE(refused, PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--runners"));
  EXPECT_GRPC_CODE(SubmitAs(admin_, "embed", false, &job, "search"), PERMISSION_DENIED);
  EXPECT_THAT(Must(store_->ListJobs({std::nullopt, "search", 100})), IsEmpty());
  // Its allowed runner, and another team's use of "embed", are served.
  ASSERT_GRPC_OK(SubmitAs(search_, "llama", false, &job));
  EXPECT_EQ(job.runner(), "llama");
  ASSERT_GRPC_OK(SubmitAs(ads_, "embed", false, &job));
  EXPECT_EQ(job.runner(), "embed");
  // Nobody but an admin changes the list; an invalid name is refused.
  EXPECT_GRPC_CODE(ChangeTeam(search_, "search", [](v1::Team* t) { t->add_runners("embed"); }), PERMISSION_DENIED);
  EXPECT_GRPC_CODE(ChangeTeam(admin_, "search", [](v1::Team* t) { t->add_runners("Evil Runner"); }),
                   INVALID_ARGUMENT);
  EXPECT_EQ(Must(store_->GetTeam("search")).runners, std::vector<std::string>{"llama"});
  // Cleared by an admin: any runner the server allows again.
  ASSERT_GRPC_OK(ChangeTeam(admin_, "search", [](v1::Team* t) { t->clear_runners(); }));
  ASSERT_GRPC_OK(SubmitAs(search_, "embed", false, &job));
}

// 40.6a per job: a job that requires confinement is leased to no executor whose runners are not
// fully confined (seccomp only, sandbox off, saying nothing, a word the server does not know), and
// says why it waits; those executors still get other work; a confined one takes it.
TEST_F(TeamRulesAttack, AJobThatRequiresConfinementIsNeverLeasedToAnUnconfinedExecutor) {
  v1::Job guarded;
  ASSERT_GRPC_OK(SubmitAs(search_, "llama", /*confined=*/true, &guarded));  // two tasks
  EXPECT_TRUE(guarded.require_confined());
  EXPECT_TRUE(StoreJob(guarded.id()).spec.requirements.confined);
  std::vector<Enrolled> unconfined;
  for (const auto& [name, confinement] : std::vector<std::pair<std::string, std::string>>{
           {"no-landlock", "partial"}, {"sandbox-off", "none"}, {"older", ""}, {"boasting", "totally"}}) {
    unconfined.push_back(Enrol(name, confinement));
    EXPECT_THAT(MustLease(unconfined.back(), 8), IsEmpty()) << name;
  }
  EXPECT_THAT(Must(store_->ListRunningTasks()), IsEmpty());
  v1::GetJobRequest get;
  get.set_job_id(guarded.id());
  v1::Job waiting;
  ASSERT_GRPC_OK(jobs_->GetJob(As(search_).get(), get, &waiting));
  EXPECT_EQ(waiting.wait_cause(), "unconfined");
  // Work that asks for nothing still goes to them.
  v1::Job open;
  ASSERT_GRPC_OK(SubmitAs(ads_, "llama", false, &open));
  std::vector<v1::TaskLease> leased = MustLease(unconfined.front(), 8);
  ASSERT_EQ(leased.size(), 2u);
  for (const v1::TaskLease& lease : leased) EXPECT_EQ(lease.ref().job_id(), open.id());
  // A fully confined executor takes the guarded job.
  Enrolled confined = Enrol("confined", "full");
  leased = MustLease(confined, 8);
  ASSERT_EQ(leased.size(), 2u);
  for (const v1::TaskLease& lease : leased) EXPECT_EQ(lease.ref().job_id(), guarded.id());
}

// 40.6a per team: a team an admin marked require_confined has every job require it, asked or not;
// only an admin marks it.
TEST_F(TeamRulesAttack, EveryJobOfATeamThatRequiresConfinementRequiresIt) {
  EXPECT_GRPC_CODE(ChangeTeam(search_, "search", [](v1::Team* t) { t->set_require_confined(true); }),
                   PERMISSION_DENIED);
  ASSERT_GRPC_OK(ChangeTeam(admin_, "search", [](v1::Team* t) { t->set_require_confined(true); }));
  v1::Job job;
  ASSERT_GRPC_OK(SubmitAs(search_, "llama", /*confined=*/false, &job));
  EXPECT_TRUE(job.require_confined());
  Enrolled partial = Enrol("no-landlock", "partial");
  EXPECT_THAT(MustLease(partial, 8), IsEmpty());
  EXPECT_THAT(Must(store_->ListRunningTasks()), IsEmpty());
  Enrolled confined = Enrol("confined", "full");
  EXPECT_EQ(MustLease(confined, 8).size(), 2u);
  // Another team's jobs are not bound by it.
  ASSERT_GRPC_OK(SubmitAs(ads_, "llama", false, &job));
  EXPECT_FALSE(job.require_confined());
  EXPECT_EQ(MustLease(partial, 8).size(), 2u);
}

}  // namespace
}  // namespace minions::testing

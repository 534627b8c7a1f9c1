// `minions teams` (Jobs.ListTeams): every team's fair-share standing for any credential that may
// see the fleet, and nothing for anyone else.
#include "grpc_service_fixture.h"

namespace minions::testing {
namespace {

class TeamsViewTest : public GrpcServiceTest {
 protected:
  void SetUp() override {
    GrpcServiceTest::SetUp();
    for (auto [name, weight, quota] : {std::tuple{"search", 3, 5}, std::tuple{"ads", 1, 0}}) {
      Team team;
      team.name = name;
      team.weight = weight;
      team.max_running_tasks = quota;
      ASSERT_OK(store_->CreateTeam(team));
    }
  }

  std::unique_ptr<v1::Admin::Stub> admins() { return v1::Admin::NewStub(rpc::MakeChannel(server_->address())); }

  grpc::Status Teams(const std::string& token, v1::ListTeamsResponse* reply) {
    return jobs_->ListTeams(Context(&token).get(), v1::ListTeamsRequest(), reply);
  }

  static const v1::Team* Find(const v1::ListTeamsResponse& reply, const std::string& name) {
    for (const v1::Team& team : reply.teams()) {
      if (team.name() == name) return &team;
    }
    return nullptr;
  }
};

TEST_F(TeamsViewTest, ATeamsViewerSeesEveryTeamsStandingAsAnAdminDoes) {
  StartServer();
  // search runs a task, so it has usage and a running task.
  const std::string search_submitter = Issue(Role::kSubmitter, "search", "alice");
  v1::SubmitJobRequest request = Request(Records(3), 3);
  request.set_team("search");
  v1::Job job;
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context(&search_submitter).get(), request, &job));
  std::string executor = RegisterExecutor("worker");
  ASSERT_EQ(MustLease(executor, 1).size(), 1u);
  fake_clock_.Advance(absl::Seconds(30));

  const std::string viewer = Issue(Role::kViewer, "ads", "bob");
  v1::ListTeamsResponse seen;
  ASSERT_GRPC_OK(Teams(viewer, &seen));
  const v1::Team* search = Find(seen, "search");
  const v1::Team* ads = Find(seen, "ads");
  ASSERT_NE(search, nullptr);
  ASSERT_NE(ads, nullptr);
  ASSERT_NE(Find(seen, "default"), nullptr);
  EXPECT_EQ(search->weight(), 3);
  EXPECT_EQ(search->max_running_tasks(), 5);
  EXPECT_EQ(search->usage().running_tasks(), 1);
  EXPECT_GT(search->usage().usage_device_seconds(), 0);
  EXPECT_EQ(search->usage().device_seconds(), 0);  // its one attempt has not ended
  EXPECT_DOUBLE_EQ(search->usage().target_share(), 3.0 / 5.0);  // search 3, ads 1, default 1
  EXPECT_DOUBLE_EQ(ads->usage().target_share(), 1.0 / 5.0);
  EXPECT_EQ(ads->usage().running_tasks(), 0);

  // The admin's view of the teams is the same rows.
  v1::ListTeamsResponse admin_view;
  ASSERT_GRPC_OK(admins()->ListTeams(Context().get(), v1::ListTeamsRequest(), &admin_view));
  ASSERT_EQ(admin_view.teams_size(), seen.teams_size());
  for (int i = 0; i < seen.teams_size(); ++i) {
    EXPECT_EQ(admin_view.teams(i).SerializeAsString(), seen.teams(i).SerializeAsString());
  }
  // A submitter may look too.
  v1::ListTeamsResponse submitter_view;
  ASSERT_GRPC_OK(Teams(search_submitter, &submitter_view));
  EXPECT_EQ(submitter_view.teams_size(), seen.teams_size());
}

TEST_F(TeamsViewTest, CallersWithoutAFleetViewAreRefused) {
  StartServer();
  const std::string none, wrong = "guess", forged = token::Mint(Role::kViewer).text;
  v1::ListTeamsResponse reply;
  EXPECT_GRPC_ERROR(Teams(none, &reply), UNAUTHENTICATED, "token");
  EXPECT_GRPC_ERROR(Teams(wrong, &reply), UNAUTHENTICATED, "token");
  EXPECT_GRPC_ERROR(Teams(forged, &reply), UNAUTHENTICATED, "unknown token");
  // A join token enrols executors and nothing else; an executor's credential runs tasks.
  EXPECT_GRPC_ERROR(Teams(join_token_, &reply), PERMISSION_DENIED, "see the fleet");
  std::string executor = RegisterExecutor("worker");
  EXPECT_GRPC_ERROR(Teams(credentials_[executor], &reply), PERMISSION_DENIED, "see the fleet");
  // A revoked viewer is refused at once on the server that revoked it.
  IssueRequest issue;
  issue.role = Role::kViewer;
  issue.team = "ads";
  issue.principal = "bob";
  ASSERT_OK_AND_ASSIGN(IssuedToken issued, server_->identities().Issue(issue, "local"));
  const std::string viewer = issued.text;
  ASSERT_GRPC_OK(Teams(viewer, &reply));
  v1::RevokeTokenRequest revoke;
  revoke.set_token_id(issued.record.id);
  v1::TokenInfo info;
  ASSERT_GRPC_OK(admins()->RevokeToken(Context().get(), revoke, &info));
  EXPECT_GRPC_ERROR(Teams(viewer, &reply), UNAUTHENTICATED, "revoked");
  EXPECT_EQ(reply.teams_size(), 1 + 2);  // only the first, accepted call filled it
}

}  // namespace
}  // namespace minions::testing

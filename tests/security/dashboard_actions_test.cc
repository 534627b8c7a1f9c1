// The dashboard's job actions (cancel and download, dashboard/status_endpoints.h) against an
// in-process server: who may cancel (a submitter of the job's team, an admin) and every refusal
// (no session, a viewer, another team, a session cookie without the page's CSRF secret or from
// another site), and downloads of an ended job's files with the same boundaries.

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/json_util.h"
#include "identity/token.h"
#include "secure_server.h"
#include "testing/even_tasks.h"
#include "testing/http_get.h"

namespace minions::testing {
namespace {

class DashboardActions : public SecureServer {
 protected:
  void SetUp() override {
    SecureServer::SetUp();
    StartServer(Options());
    base_ = absl::StrCat("http://127.0.0.1:", server_->http_port());
    origin_ = absl::StrCat("Origin: http://127.0.0.1:", server_->http_port());
    CreateTeam("search");
    CreateTeam("ads");
    submitter_ = Issue(Role::kSubmitter, "search", "alice");
    viewer_ = Issue(Role::kViewer, "search", "bob");
    other_team_ = Issue(Role::kSubmitter, "ads", "carol");
  }
  std::string StateOf(const std::string& job) { return std::string(JobStateName(Must(store_->GetJob(job)).state)); }

  // A browser's session: signed in on the login page, with the page's CSRF secret as /api/fleet gives it.
  struct Session {
    std::string cookie;  // "Cookie: minions_session=..."
    std::string csrf;
  };
  Session SignIn(const std::string& token) {
    HttpReply login = HttpPost(base_ + "/login", "token=" + token, {origin_});
    EXPECT_EQ(login.status, 303) << login.body;
    const std::string set = login.headers["set-cookie"];
    Session session{"Cookie: " + set.substr(0, set.find(';')), ""};
    Json fleet = Must(ParseJson(HttpGet(base_ + "/api/fleet", 10000, {session.cookie}).body));
    session.csrf = fleet["viewer"].value("csrf", "");
    return session;
  }
  HttpReply Cancel(const std::string& job, const std::vector<std::string>& headers) {
    return HttpPost(base_ + "/api/job/cancel", "id=" + job, headers);
  }

  std::string base_, origin_;
  std::string submitter_, viewer_, other_team_;
};

TEST_F(DashboardActions, OnlyASubmitterOfTheJobsTeamCancelsFromTheDashboardPage) {
  const std::string job = StoreJobOf("search");
  // No session, a made-up one, a forged token: 401.
  EXPECT_EQ(Cancel(job, {}).status, 401);
  EXPECT_EQ(Cancel(job, {"Cookie: minions_session=" + std::string(64, 'a'), origin_}).status, 401);
  EXPECT_EQ(Cancel(job, Bearer(token::Mint(Role::kAdmin).text)).status, 401);
  // A viewer of the team, signed in on the page with its secret: may look, not cancel.
  Session viewer = SignIn(viewer_);
  ASSERT_EQ(viewer.csrf.size(), 64u);
  HttpReply refused = Cancel(job, {viewer.cookie, origin_, "X-CSRF-Token: " + viewer.csrf});
  EXPECT_EQ(refused.status, 403) << refused.body;
  EXPECT_EQ(Cancel(job, Bearer(viewer_)).status, 403);
  // Another team's submitter: the job does not exist for it, word for word as an unknown one.
  HttpReply hidden = Cancel(job, Bearer(other_team_));
  HttpReply unknown = Cancel("job-000000000000", Bearer(other_team_));
  EXPECT_EQ(hidden.status, 404);
  EXPECT_EQ(hidden.body, absl::StrReplaceAll(unknown.body, {{"job-000000000000", job}}));
  Session other = SignIn(other_team_);
  EXPECT_EQ(Cancel(job, {other.cookie, origin_, "X-CSRF-Token: " + other.csrf}).status, 404);
  // The job's own submitter, signed in, but the request is not the page's: without the secret,
  // with another session's, from another site, from an opaque origin: 403 each.
  Session alice = SignIn(submitter_);
  ASSERT_FALSE(alice.csrf.empty());
  EXPECT_NE(alice.csrf, viewer.csrf);
  EXPECT_EQ(alice.cookie.find(alice.csrf), std::string::npos) << "the secret is never in the cookie";
  for (const std::vector<std::string>& headers :
       {std::vector<std::string>{alice.cookie, origin_},
        {alice.cookie, origin_, "X-CSRF-Token: " + viewer.csrf},
        {alice.cookie, origin_, "X-CSRF-Token: " + alice.csrf.substr(1)},
        {alice.cookie, "Origin: https://evil.example", "X-CSRF-Token: " + alice.csrf},
        {alice.cookie, "Origin: null", "X-CSRF-Token: " + alice.csrf}}) {
    HttpReply forged = Cancel(job, headers);
    EXPECT_EQ(forged.status, 403) << absl::StrJoin(headers, " | ") << ": " << forged.body;
    EXPECT_THAT(forged.body, HasSubstr("dashboard page"));
  }
  // A bearer token gives no secret (none is needed: no browser sends it by itself).
  Json by_token = Must(ParseJson(HttpGet(base_ + "/api/fleet", 10000, Bearer(submitter_)).body));
  EXPECT_FALSE(by_token["viewer"].contains("csrf"));
  EXPECT_EQ(StateOf(job), "queued") << "no refusal cancelled it";
  // The page offers the cancel to the submitter only.
  EXPECT_EQ(Must(ParseJson(HttpGet(base_ + "/api/job?id=" + job, 10000, {viewer.cookie}).body))["actions"]["cancel"], false);
  EXPECT_EQ(Must(ParseJson(HttpGet(base_ + "/api/job?id=" + job, 10000, {alice.cookie}).body))["actions"]["cancel"], true);
  // From the page, as the page sends it: cancelled, and its files offered at once.
  HttpReply done = Cancel(job, {alice.cookie, origin_, "X-CSRF-Token: " + alice.csrf});
  ASSERT_EQ(done.status, 200) << done.body;
  Json answer = Must(ParseJson(done.body));
  EXPECT_EQ(answer["state"], "cancelled");
  EXPECT_EQ(answer["actions"]["cancel"], false);
  EXPECT_EQ(answer["actions"]["results"], "/api/results?id=" + job);
  EXPECT_EQ(StateOf(job), "cancelled");
  // Ended: a second cancel says so.
  HttpReply again = Cancel(job, Bearer(submitter_));
  EXPECT_EQ(again.status, 409);
  EXPECT_THAT(again.body, HasSubstr("has ended"));
  // An admin cancels any team's job with its token.
  const std::string theirs = StoreJobOf("ads");
  EXPECT_EQ(Cancel(theirs, Bearer(admin_)).status, 200);
  EXPECT_EQ(StateOf(theirs), "cancelled");
  // Signed out, the session's secret is worth nothing.
  ASSERT_EQ(HttpPost(base_ + "/logout", "", {alice.cookie}).status, 303);
  const std::string later = StoreJobOf("search");
  EXPECT_EQ(Cancel(later, {alice.cookie, origin_, "X-CSRF-Token: " + alice.csrf}).status, 401);
  EXPECT_EQ(StateOf(later), "queued");
}

TEST_F(DashboardActions, AnEndedJobsFilesDownloadForItsTeamOnly) {
  std::string input;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&input, R"({"custom_id":"r)", i, R"(","body":{"messages":[{"role":"user","content":"hi"}]}})", "\n");
  }
  ASSERT_TRUE(blobs_->Put("uploads/x/y/in.jsonl", input).ok());
  const std::string job = StoreJobOf("search", 2);  // 4 records
  // Running (queued): no results yet, said so.
  HttpReply early = HttpGet(base_ + "/api/results?id=" + job, 10000, Bearer(viewer_));
  EXPECT_EQ(early.status, 409) << early.body;
  EXPECT_THAT(early.body, HasSubstr("results exist once"));
  EXPECT_TRUE(Must(ParseJson(HttpGet(base_ + "/api/job?id=" + job, 10000, Bearer(viewer_)).body))["actions"]["results"].is_null());
  ASSERT_TRUE(store_->CancelJob(job, absl::Now()).ok());
  // No credential, a monitor, another team: refused; nothing of the file is sent.
  EXPECT_EQ(HttpGet(base_ + "/api/results?id=" + job).status, 401);
  EXPECT_EQ(HttpGet(base_ + "/api/results?id=" + job, 10000, Bearer(Issue(Role::kMonitor, "", "prom"))).status, 403);
  HttpReply hidden = HttpGet(base_ + "/api/results?id=" + job + "&file=errors", 10000, Bearer(other_team_));
  EXPECT_EQ(hidden.status, 404);
  EXPECT_EQ(hidden.body.find("batch_cancelled"), std::string::npos);
  EXPECT_EQ(HttpGet(base_ + "/api/results?id=" + job + "&file=secrets", 10000, Bearer(viewer_)).status, 400);
  EXPECT_EQ(HttpGet(base_ + "/api/resultsX?id=" + job, 10000, Bearer(viewer_)).status, 404);
  // A viewer of the team, signed in on the page: the cancelled job's files, as `minions results`
  // gives them: nothing ran, so no answers and an error line per record.
  Session viewer = SignIn(viewer_);
  Json actions = Must(ParseJson(HttpGet(base_ + "/api/job?id=" + job, 10000, {viewer.cookie}).body))["actions"];
  ASSERT_TRUE(actions["errors"].is_string()) << actions.dump();
  HttpReply errors = HttpGet(base_ + actions["errors"].get<std::string>(), 10000, {viewer.cookie});
  ASSERT_EQ(errors.status, 200) << errors.body;
  EXPECT_THAT(errors.headers["content-disposition"], HasSubstr(job + "-errors.jsonl"));
  std::vector<std::string> lines = absl::StrSplit(errors.body, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << errors.body;
  for (const std::string& line : lines) EXPECT_THAT(line, HasSubstr("batch_cancelled"));
  HttpReply output = HttpGet(base_ + actions["results"].get<std::string>(), 10000, {viewer.cookie});
  EXPECT_EQ(output.status, 200);
  EXPECT_EQ(output.body, "");
  EXPECT_THAT(output.headers["content-disposition"], HasSubstr(job + "-output.jsonl"));
}

}  // namespace
}  // namespace minions::testing

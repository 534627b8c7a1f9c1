// Attacks on the HTTP port: slow and greedy clients, malformed and oversized requests, pages
// without a credential or with the wrong one, another team's jobs, a login from another site.
// Each asserts the refusal and that honest callers are served on.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/json_util.h"
#include "identity/token.h"
#include "raw_tcp.h"
#include "secure_server.h"
#include "testing/even_tasks.h"
#include "testing/http_get.h"
#include "testing/socket_read.h"

namespace minions::testing {
namespace {

// Whether the server closed `fd` (reads end), waiting up to `timeout`.
bool ClosedByServer(int fd, absl::Duration timeout) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0) return false;
  char buffer[4096];
  while (true) {
    ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

// Sends `request` whole on a fresh connection and returns what came back (until the server closes).
std::string RawExchange(int port, const std::string& request) {
  int fd = Connect(port);
  if (fd < 0) return "";
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string answer = ReadFromSocket(fd, absl::Seconds(5));
  close(fd);
  return answer;
}

class HttpAttack : public SecureServer {
 protected:
  void SetUp() override {
    SecureServer::SetUp();
    ServerOptions options = Options();
    options.http.request_timeout = absl::Seconds(1);  // slow clients are dropped soon
    StartServer(options);
    base_ = absl::StrCat("http://127.0.0.1:", server_->http_port());
    CreateTeam("search");
    CreateTeam("ads");
    search_viewer_ = Issue(Role::kViewer, "search", "bob");
  }
  HttpReply Get(const std::string& path, const std::string& token = "") {
    return HttpGet(base_ + path, 10000, token.empty() ? std::vector<std::string>{} : Bearer(token));
  }

  std::string base_;
  std::string search_viewer_;
};

TEST_F(HttpAttack, SlowClientsHoldConnectionsNotThreadsAndReadyzAnswersThroughThem) {
  // Two dozen clients that never finish their request: some silent, some trickling a byte at a
  // time (six of these used to stall /readyz behind the old server's four threads).
  std::vector<int> slow;
  for (int i = 0; i < 24; ++i) {
    int fd = Connect(server_->http_port());
    ASSERT_GE(fd, 0);
    if (i % 2 == 0) (void)!send(fd, "GET /api/jobs HTTP/1.1\r\nHo", 26, MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    for (int round = 0; trickling && round < 200; ++round) {
      for (size_t i = 0; i < slow.size(); i += 2) (void)!send(slow[i], "x", 1, MSG_NOSIGNAL);
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  // While they hang on, every honest request is answered.
  for (int i = 0; i < 20; ++i) {
    HttpReply ready = Get("/readyz");
    ASSERT_EQ(ready.status, 200) << "try " << i;
    EXPECT_EQ(ready.body, "ready\n");
  }
  EXPECT_EQ(Get("/api/jobs", search_viewer_).status, 200);
  trickling = false;
  trickle.join();
  // And none of them is served for ever: each is dropped once its request is overdue.
  for (int fd : slow) {
    EXPECT_TRUE(ClosedByServer(fd, absl::Seconds(30)));
    close(fd);
  }
  EXPECT_EQ(Get("/readyz").status, 200);
}

TEST_F(HttpAttack, OneAddressCannotHoldTheWholePort) {
  // 40 connections from one address: beyond 32 they are closed at once.
  std::vector<int> greedy;
  for (int i = 0; i < 40; ++i) greedy.push_back(Connect(server_->http_port(), "127.0.0.2"));
  int dropped = 0;
  for (int fd : greedy) dropped += fd < 0 || ClosedByServer(fd, absl::Milliseconds(500));
  EXPECT_GE(dropped, 8);
  // Another address is served meanwhile.
  EXPECT_EQ(Get("/readyz").status, 200);
  for (int fd : greedy) {
    if (fd >= 0) close(fd);
  }
}

TEST_F(HttpAttack, MalformedAndOversizedRequestsAreRefusedAndTheServerServesOn) {
  const int port = server_->http_port();
  EXPECT_THAT(RawExchange(port, "GARBAGE\r\n\r\n"), StartsWith("HTTP/1.1 400"));
  EXPECT_THAT(RawExchange(port, "DELETE /api/jobs HTTP/1.1\r\nHost: x\r\n\r\n"), StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(RawExchange(port, "GET /healthz HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n"),
              StartsWith("HTTP/1.1 431"));
  EXPECT_THAT(RawExchange(port, "POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"),
              StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(RawExchange(port, "POST /login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
              StartsWith("HTTP/1.1 501"));
  // A response header cannot be forged through a query string.
  std::string answer = RawExchange(port, "GET /nowhere%0d%0aSet-Cookie:%20x=y HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 404"));
  EXPECT_EQ(answer.find("\r\nSet-Cookie"), std::string::npos);
  EXPECT_EQ(Get("/healthz").body, "ok\n");
}

TEST_F(HttpAttack, EveryPageButHealthAsksForTheRightCredential) {
  // Open pages say nothing else.
  EXPECT_EQ(Get("/healthz").body, "ok\n");
  EXPECT_EQ(Get("/readyz").body, "ready\n");
  // No credential: refused (the page itself sends a browser to sign in).
  for (const char* path : {"/metrics", "/api/fleet", "/api/jobs", "/api/job?id=job-000000000000"}) {
    HttpReply reply = Get(path);
    EXPECT_EQ(reply.status, 401) << path;
    EXPECT_EQ(reply.body.find("minions_"), std::string::npos) << path;
  }
  HttpReply page = Get("/");
  EXPECT_EQ(page.status, 302);
  EXPECT_EQ(page.headers["location"], "/login");
  // A forged token and a revoked one: refused.
  EXPECT_EQ(Get("/api/jobs", token::Mint(Role::kAdmin).text).status, 401);
  const std::string revoked = Issue(Role::kViewer, "search", "gone");
  EXPECT_EQ(Get("/api/jobs", revoked).status, 200);
  server_->authenticator().Forget(Must(store_->FindToken(token::Hash(revoked))).id);
  ASSERT_TRUE(store_->RevokeToken(Must(store_->FindToken(token::Hash(revoked))).id, absl::Now()).ok());
  EXPECT_EQ(Get("/api/jobs", revoked).status, 401);
  // The wrong role: a viewer reads no metrics, a monitor no jobs, an executor nothing.
  EXPECT_EQ(Get("/metrics", search_viewer_).status, 403);
  const std::string monitor = Issue(Role::kMonitor, "", "prometheus");
  EXPECT_EQ(Get("/metrics", monitor).status, 200);
  EXPECT_EQ(Get("/api/jobs", monitor).status, 403);
  Enrolled worker = Enrol("worker");
  EXPECT_EQ(Get("/api/fleet", worker.credential).status, 403);
  EXPECT_EQ(Get("/metrics", worker.credential).status, 403);
}

TEST_F(HttpAttack, ADashboardViewerSeesOnlyItsTeamsJobs) {
  const std::string ours = StoreJobOf("search");
  const std::string theirs = StoreJobOf("ads");
  Json jobs = Must(ParseJson(Get("/api/jobs", search_viewer_).body));
  ASSERT_EQ(jobs["jobs"].size(), 1u);
  EXPECT_EQ(jobs["jobs"][0]["id"], ours);
  EXPECT_EQ(jobs["total"], 1);
  // Another team's job answers word for word as an unknown one.
  HttpReply hidden = Get("/api/job?id=" + theirs, search_viewer_);
  HttpReply unknown = Get("/api/job?id=job-000000000000", search_viewer_);
  EXPECT_EQ(hidden.status, 404);
  EXPECT_EQ(hidden.body, absl::StrReplaceAll(unknown.body, {{"job-000000000000", theirs}}));
  EXPECT_EQ(Get("/api/job?id=" + ours, search_viewer_).status, 200);
  // Counts are the team's own; the fleet shows no other team's work.
  Enrolled worker = Enrol("worker");
  ASSERT_FALSE(MustLease(worker, 2).empty());
  Json fleet = Must(ParseJson(Get("/api/fleet", search_viewer_).body));
  EXPECT_EQ(fleet["jobs_by_state"].value("queued", 0) + fleet["jobs_by_state"].value("running", 0), 1);
  for (const Json& e : fleet["executors"]) {
    for (const Json& t : e["tasks"]) EXPECT_EQ(t["job"], ours);
  }
  EXPECT_EQ(fleet.dump().find(theirs), std::string::npos);
  // An admin sees both.
  EXPECT_EQ(Must(ParseJson(Get("/api/jobs", admin_).body))["jobs"].size(), 2u);
}

// 40.7f: the dashboard's fleet shows a team no other team's model digests or loaded model, and
// heartbeat ages from a time rounded to 30 seconds.
TEST_F(HttpAttack, TheDashboardFleetHidesAnotherTeamsModels) {
  const std::string theirs = "sha256:" + std::string(64, 'b');
  AddModel("ads", "theirs", theirs);
  Enrolled worker = Enrol("worker");
  ASSERT_GRPC_OK(RegisterHolding(worker, "worker", {theirs}, theirs));
  const std::string body = Get("/api/fleet", search_viewer_).body;
  EXPECT_EQ(body.find(std::string(40, 'b')), std::string::npos) << body;
  Json fleet = Must(ParseJson(body));
  ASSERT_EQ(fleet["executors"].size(), 1u);
  EXPECT_EQ(fleet["executors"][0]["model_loaded"], "");
  EXPECT_EQ(fleet["executors"][0]["model_loaded_shown"], "(another team's model)");
  EXPECT_TRUE(fleet["executors"][0]["models_cached"].empty());
  EXPECT_NE(Get("/api/fleet", admin_).body.find(std::string(40, 'b')), std::string::npos);
}

TEST_F(HttpAttack, TheLoginSetsAnHttpOnlySessionThatEndsWithItsToken) {
  HttpReply bad = HttpPost(base_ + "/login", "token=mnv_%3Cscript%3Ealert(1)%3C%2Fscript%3E");
  EXPECT_EQ(bad.status, 401);
  EXPECT_EQ(bad.body.find("<script>alert"), std::string::npos);
  EXPECT_TRUE(bad.headers["set-cookie"].empty());
  // From another site's page: refused, no cookie.
  HttpReply cross = HttpPost(base_ + "/login", "token=" + search_viewer_, {"Origin: https://evil.example"});
  EXPECT_EQ(cross.status, 403);
  EXPECT_TRUE(cross.headers["set-cookie"].empty());
  // From an opaque origin (a sandboxed frame or a data: page any site can make): refused too.
  HttpReply opaque = HttpPost(base_ + "/login", "token=" + search_viewer_, {"Origin: null"});
  EXPECT_EQ(opaque.status, 403);
  EXPECT_TRUE(opaque.headers["set-cookie"].empty());
  // From the dashboard's own page: signed in.
  HttpReply good = HttpPost(base_ + "/login", "token=" + search_viewer_,
                            {absl::StrCat("Origin: http://127.0.0.1:", server_->http_port())});
  EXPECT_EQ(good.status, 303);
  EXPECT_EQ(good.headers["location"], "/");
  const std::string cookie = good.headers["set-cookie"];
  EXPECT_THAT(cookie, HasSubstr("HttpOnly"));
  EXPECT_THAT(cookie, HasSubstr("SameSite=Strict"));
  EXPECT_THAT(cookie, HasSubstr("Max-Age=43200"));  // the session expires
  const std::string session = cookie.substr(0, cookie.find(';'));
  EXPECT_EQ(HttpGet(base_ + "/api/jobs", 10000, {"Cookie: " + session}).status, 200);
  EXPECT_EQ(HttpGet(base_ + "/", 10000, {"Cookie: " + session}).status, 200);
  // 40.7d': the cookie names a session, never the token; a token or a made-up id as the cookie
  // signs nobody in.
  EXPECT_EQ(cookie.find(search_viewer_), std::string::npos);
  EXPECT_EQ(HttpGet(base_ + "/api/jobs", 10000, {absl::StrCat("Cookie: minions_session=", search_viewer_)}).status, 401);
  EXPECT_EQ(HttpGet(base_ + "/api/jobs", 10000, {"Cookie: minions_session=" + std::string(64, 'a')}).status, 401);
  // Signing out ends the session on the server, not only in the browser.
  HttpReply other = HttpPost(base_ + "/login", "token=" + search_viewer_,
                             {absl::StrCat("Origin: http://127.0.0.1:", server_->http_port())});
  const std::string other_session = other.headers["set-cookie"].substr(0, other.headers["set-cookie"].find(';'));
  EXPECT_NE(other_session, session);
  EXPECT_EQ(HttpGet(base_ + "/api/jobs", 10000, {"Cookie: " + other_session}).status, 200);
  EXPECT_EQ(HttpPost(base_ + "/logout", "", {"Cookie: " + other_session}).status, 303);
  EXPECT_EQ(HttpGet(base_ + "/api/jobs", 10000, {"Cookie: " + other_session}).status, 401);
  EXPECT_EQ(HttpGet(base_ + "/api/jobs", 10000, {"Cookie: " + session}).status, 200);
  // A session ends with its token: revoked, it ends.
  const std::string id = Must(store_->FindToken(token::Hash(search_viewer_))).id;
  ASSERT_TRUE(store_->RevokeToken(id, absl::Now()).ok());
  server_->authenticator().Forget(id);
  EXPECT_EQ(HttpGet(base_ + "/api/jobs", 10000, {"Cookie: " + session}).status, 401);
  HttpReply out = HttpPost(base_ + "/logout", "");
  EXPECT_EQ(out.status, 303);
  EXPECT_THAT(out.headers["set-cookie"], HasSubstr("Max-Age=0"));
}

TEST_F(HttpAttack, LargeListingsComeInPages) {
  const std::string big = StoreJobOf("search", 1200);
  for (int i = 0; i < 120; ++i) StoreJobOf("search");
  Json first = Must(ParseJson(Get("/api/jobs", search_viewer_).body));
  EXPECT_EQ(first["jobs"].size(), 100u);
  EXPECT_EQ(first["total"], 121);
  EXPECT_EQ(first["next_offset"], 100);
  Json second = Must(ParseJson(Get("/api/jobs?offset=100&limit=100000", search_viewer_).body));
  EXPECT_EQ(second["jobs"].size(), 21u);
  EXPECT_EQ(second["limit"], 500);  // capped
  EXPECT_TRUE(second["next_offset"].is_null());
  Json tasks = Must(ParseJson(Get("/api/job?id=" + big, search_viewer_).body));
  EXPECT_EQ(tasks["tasks"].size(), 500u);
  EXPECT_EQ(tasks["tasks_page"]["total"], 1200);
  // The gRPC listing of a job's tasks is paged too.
  v1::ListTasksRequest request;
  request.set_job_id(big);
  v1::ListTasksResponse page;
  ASSERT_GRPC_OK(jobs_->ListTasks(As(search_viewer_).get(), request, &page));
  EXPECT_EQ(page.tasks_size(), 1000);
  ASSERT_FALSE(page.next_page_token().empty());
  request.set_page_token(page.next_page_token());
  ASSERT_GRPC_OK(jobs_->ListTasks(As(search_viewer_).get(), request, &page));
  EXPECT_EQ(page.tasks_size(), 200);
  EXPECT_TRUE(page.next_page_token().empty());
  request.set_page_token("-5");
  EXPECT_GRPC_CODE(jobs_->ListTasks(As(search_viewer_).get(), request, &page), INVALID_ARGUMENT);
}

}  // namespace
}  // namespace minions::testing

// Attacks on the transport: a client that does not know the pool's CA, a server presenting a
// name the client did not dial, plain text to TLS ports, and plain text off loopback on either
// side. Each asserts the refusal and that the server serves its honest clients on.

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/match.h"
#include "cli/client_verbs.h"
#include "common/host_port.h"
#include "raw_tcp.h"
#include "secure_server.h"
#include "testing/http_get.h"

namespace minions::testing {
namespace {

class TlsAttack : public SecureServer {
 protected:
  // A server on TLS from the pool's CA; the fixture's stubs speak TLS checked against it.
  void StartTlsServer() {
    pool_ = MakePki("pool");
    ServerOptions options = Options();
    options.tls = {pool_.server_cert, pool_.server_key};
    StartServer(options, rpc::ClientTls{pool_.ca_cert, ""});
  }
  // ListJobs through a channel opened with `tls`.
  grpc::Status ListJobsOver(const rpc::ClientTls& tls) {
    auto channel = rpc::OpenChannel(server_->address(), tls);
    if (!channel.ok()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no channel");
    auto stub = v1::Jobs::NewStub(*channel);
    v1::ListJobsResponse reply;
    auto context = As(admin_);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->ListJobs(context.get(), v1::ListJobsRequest(), &reply);
  }
  bool Honest() { return ListJobsOver({pool_.ca_cert, ""}).ok(); }
  // What a control plane with `options` says when it starts (one that starts is shut down).
  absl::Status StartAndStop(const ServerOptions& options) {
    ControlPlane plane(store_.get(), blobs_.get(), &clock_, ControlPlaneOptions{options});
    absl::Status started = plane.Start();
    if (started.ok()) plane.Shutdown();
    return started;
  }
  // A control plane with `options` refuses to start, saying `says`.
  void ExpectRefused(const ServerOptions& options, const std::string& says) {
    absl::Status refused = StartAndStop(options);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr(says));
  }

  pki::Files pool_;
};

TEST_F(TlsAttack, AClientThatDoesNotKnowThePoolsCaIsRefused) {
  StartTlsServer();
  ASSERT_TRUE(Honest());
  // Another pool's CA (a server impersonating ours would present such a certificate).
  pki::Files other = MakePki("other");
  grpc::Status refused = ListJobsOver({other.ca_cert, ""});
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  // The right CA, but a name the certificate does not carry.
  grpc::Status wrong_name = ListJobsOver({pool_.ca_cert, "attacker.example"});
  EXPECT_EQ(wrong_name.error_code(), grpc::StatusCode::UNAVAILABLE) << wrong_name.error_message();
  EXPECT_TRUE(Honest());
}

TEST_F(TlsAttack, PlainTextToTheTlsPortsGetsNothing) {
  StartTlsServer();
  auto plain = v1::Jobs::NewStub(rpc::MakeChannel(server_->address()));
  v1::ListJobsResponse reply;
  auto context = As(admin_);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status status = plain->ListJobs(context.get(), v1::ListJobsRequest(), &reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_EQ(reply.jobs_size(), 0);
  // HTTP: plain text to the HTTPS port has no answer; over TLS it does.
  const std::string port = absl::StrCat(server_->http_port());
  EXPECT_EQ(HttpGet("http://127.0.0.1:" + port + "/healthz", 5000).status, 0);
  HttpOptions https;
  https.ca_file = pool_.ca_cert;
  EXPECT_EQ(HttpRequestOnce("https://127.0.0.1:" + port + "/healthz", https).status, 200);
  // An HTTPS client without the CA does not trust the server either.
  EXPECT_EQ(HttpGet("https://127.0.0.1:" + port + "/healthz", 5000).status, 0);
  EXPECT_TRUE(Honest());
}

TEST_F(TlsAttack, TheServerRefusesPlainTextOffLoopback) {
  ServerOptions options = Options();
  options.listen = "0.0.0.0:0";
  ExpectRefused(options, "pki init");
  options = Options();
  options.http_listen = "0.0.0.0:0";
  ExpectRefused(options, "");
  // With a certificate, the same addresses are served.
  pki::Files files = MakePki("open");
  options = Options();
  options.listen = "0.0.0.0:0";
  options.http_listen = "0.0.0.0:0";
  options.tls = {files.server_cert, files.server_key};
  EXPECT_TRUE(StartAndStop(options).ok());
}

TEST_F(TlsAttack, AClientNeverSendsItsTokenInPlainTextOffLoopback) {
  StartServer();
  // Refused before any connection is made (192.0.2.1 is TEST-NET: nothing answers there anyway).
  const std::string remote = "192.0.2.1:7070";
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = rpc::OpenChannel(remote, {});
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(channel.status().message()), HasSubstr("in the clear"));
  cli::Connection connection;
  connection.server = remote;
  connection.token = admin_;
  absl::StatusOr<std::vector<v1::Job>> listed = cli::JobsClient(connection).List("", 1);
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kFailedPrecondition);
  // Loopback stays effortless.
  EXPECT_TRUE(rpc::OpenChannel("127.0.0.1:1", {}).ok());
  EXPECT_TRUE(rpc::OpenChannel("localhost:1", {}).ok());
}

// This process's resident memory, in bytes (VmRSS).
int64_t ResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmRSS:")) return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

// The attacker of the tests below, run in a process of its own (this binary again, with the
// server's address and CA in its environment; an empty CA: plain text): four 200 MB submits at
// once, with no token, or with MINIONS_ATTACK_TOKEN's (a caller the server knows). It exits with
// the number refused: as unauthenticated without a token, as too large with one. Skipped when run
// as a test of its own.
TEST(NoTokenAttacker, SendsFourLargeCallsWithoutAToken) {
  const char* address = std::getenv("MINIONS_ATTACK_ADDRESS");
  const char* ca = std::getenv("MINIONS_ATTACK_CA");
  const char* token = std::getenv("MINIONS_ATTACK_TOKEN");
  if (!address || !ca) GTEST_SKIP() << "run by TlsAttack.*CallsWithoutACredentialAreRefusedBeforeTheirMessageIsRead";
  auto channel = rpc::OpenChannel(address, {ca, ""});
  if (!channel.ok()) _exit(100);
  auto stub = v1::Jobs::NewStub(*channel);
  v1::SubmitJobRequest request;
  request.set_input(std::string(200 << 20, 'x'));
  request.set_model("m");
  const grpc::StatusCode expected =
      token != nullptr ? grpc::StatusCode::RESOURCE_EXHAUSTED : grpc::StatusCode::UNAUTHENTICATED;
  std::atomic<int> refused{0};
  std::vector<std::thread> calls;
  for (int i = 0; i < 4; ++i) {
    calls.emplace_back([&] {
      grpc::ClientContext context;
      if (token != nullptr) rpc::Prepare(context, token, absl::Seconds(120));
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      v1::Job job;
      if (stub->SubmitJob(&context, request, &job).error_code() == expected) ++refused;
    });
  }
  for (auto& call : calls) call.join();
  _exit(refused.load());
}

// Runs the attacker above against this process's server (`ca` empty: plain text; `token` empty:
// none) and checks that every call was refused without the server holding their messages. The
// attacker is another process, so that this process's memory is the server's alone.
void ExpectRefusedBeforeRead(const std::string& server_address, const std::string& ca_file,
                             const std::string& token = "") {
  const int64_t before = ResidentBytes();
  // Made before the fork: the child of a threaded process only execs.
  std::string address = "MINIONS_ATTACK_ADDRESS=" + server_address;
  std::string ca = "MINIONS_ATTACK_CA=" + ca_file;
  std::string with_token = "MINIONS_ATTACK_TOKEN=" + token;
  char* env[] = {address.data(), ca.data(), token.empty() ? nullptr : with_token.data(), nullptr};
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execle("/proc/self/exe", "attacker", "--gtest_filter=NoTokenAttacker.*", static_cast<char*>(nullptr), env);
    _exit(101);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  const int64_t after = ResidentBytes();
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 4) << (token.empty() ? "calls refused as unauthenticated" : "calls refused as too large");
  // Each message was refused from its headers: the server never held them (it used to read all
  // 800 MB first, and keep much of it).
  EXPECT_LT(after - before, int64_t{150} << 20) << "before " << before << ", after " << after;
}

TEST_F(TlsAttack, CallsWithoutACredentialAreRefusedBeforeTheirMessageIsRead) {
  StartTlsServer();
  ExpectRefusedBeforeRead(server_->address(), pool_.ca_cert);
  // Honest callers are served on.
  EXPECT_TRUE(Honest());
}

// The same on a plain-text (loopback) pool: its gate is the same, on gRPC's local credentials.
TEST_F(TlsAttack, PlainTextCallsWithoutACredentialAreRefusedBeforeTheirMessageIsRead) {
  StartServer();
  ExpectRefusedBeforeRead(server_->address(), "");
  v1::ListJobsResponse reply;
  EXPECT_TRUE(jobs_->ListJobs(As(admin_).get(), v1::ListJobsRequest(), &reply).ok());
}

// 40.2d: a caller with a valid credential sending 200 MB messages: each is refused (a few MiB is
// the receive limit: inputs travel in parts, Jobs.UploadInput). gRPC 1.51 reads a message whole
// before it applies that limit (with no memory quota, four such calls took this server from 28 MB
// to 540-690 MB); its memory quota (ServerOptions::grpc_memory_bytes) is what bounds it: past it,
// gRPC cancels the streams instead of reading on. With a 64 MiB quota the server does not grow by
// what was sent, and an honest large input (sent in parts) and honest calls are served under it.
TEST_F(TlsAttack, ACallersLargeMessagesAreRefusedWithoutTheServerHoldingThem) {
  ServerOptions options = Options();
  options.grpc_memory_bytes = int64_t{64} << 20;
  StartServer(options);
  CreateTeam("search");
  ExpectRefusedBeforeRead(server_->address(), "", Issue(Role::kSubmitter, "search", "alice"));
  // A large input still travels, in parts: the CLI's submit streams it.
  const std::string input = Records(60000);  // ~2.3 MB, past the inline limit
  ASSERT_GT(static_cast<int64_t>(input.size()), kMaxInlineInputBytes);
  v1::SubmitJobRequest request = Request(1, "search");
  request.set_input(input);
  request.set_shard_size(1000);
  absl::StatusOr<v1::Job> job = cli::SubmitJob(*jobs_, Issue(Role::kSubmitter, "search", "bob"), request);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->request_counts().total(), 60000);
  EXPECT_EQ(Must(store_->GetTeam("search")).file_bytes, static_cast<int64_t>(input.size()));
  v1::ListJobsResponse listed;
  EXPECT_TRUE(jobs_->ListJobs(As(admin_).get(), v1::ListJobsRequest(), &listed).ok());
}

// Plain text only where gRPC's local credentials (and so the gate) work: 127.0.0.1, ::1 or
// localhost. Another loopback address is refused with what to do, rather than served ungated.
TEST_F(TlsAttack, PlainTextListensOnlyWhereTheGateWorks) {
  ServerOptions options = Options();
  options.listen = "127.0.0.2:0";
  ExpectRefused(options, "127.0.0.1");
  options.listen = "localhost:0";
  EXPECT_TRUE(StartAndStop(options).ok());
}

// Connections that say nothing (no HTTP/2 preface, so no call and nothing to refuse) are closed
// after the handshake timeout, however many one peer opens; honest callers are served meanwhile.
TEST_F(TlsAttack, ConnectionsThatSayNothingAreClosedAndHonestCallersAreServed) {
  ServerOptions options = Options();
  options.grpc_handshake_timeout = absl::Seconds(1);
  StartServer(options);
  std::string host;
  int port = 0;
  ASSERT_TRUE(SplitHostPort(server_->address(), &host, &port).ok());
  std::vector<int> silent;
  for (int i = 0; i < 200; ++i) {
    int fd = Connect(port);
    ASSERT_GE(fd, 0);
    silent.push_back(fd);
  }
  v1::ListJobsResponse reply;
  EXPECT_TRUE(jobs_->ListJobs(As(admin_).get(), v1::ListJobsRequest(), &reply).ok());
  // Each is closed by the server (end of stream); the bound is generous, as under load (the
  // default timeout, 120 s, would not close one within it).
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  int closed = 0;
  for (int fd : silent) {
    while (absl::Now() < give_up) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        char buffer[256];
        if (recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT) <= 0) {
          ++closed;
          break;
        }
      }
    }
    close(fd);
  }
  EXPECT_EQ(closed, 200);
  EXPECT_TRUE(jobs_->ListJobs(As(admin_).get(), v1::ListJobsRequest(), &reply).ok());
}

}  // namespace
}  // namespace minions::testing

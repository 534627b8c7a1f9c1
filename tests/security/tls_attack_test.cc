// Attacks on the transport: a client that does not know the pool's CA, a server presenting a
// name the client did not dial, plain text to TLS ports, and plain text off loopback on either
// side. Each asserts the refusal and that the server serves its honest clients on.

#include "cli/client_verbs.h"
#include "secure_server.h"
#include "testing/http_get.h"

namespace minions::testing {
namespace {

using ::testing::HasSubstr;

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
  ControlPlane grpc_open(store_.get(), blobs_.get(), &clock_, ControlPlaneOptions{options});
  absl::Status refused = grpc_open.Start();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("pki init"));
  options = Options();
  options.http_listen = "0.0.0.0:0";
  ControlPlane http_open(store_.get(), blobs_.get(), &clock_, ControlPlaneOptions{options});
  refused = http_open.Start();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  // With a certificate, the same addresses are served.
  pki::Files files = MakePki("open");
  options = Options();
  options.listen = "0.0.0.0:0";
  options.http_listen = "0.0.0.0:0";
  options.tls = {files.server_cert, files.server_key};
  ControlPlane with_tls(store_.get(), blobs_.get(), &clock_, ControlPlaneOptions{options});
  EXPECT_TRUE(with_tls.Start().ok());
  with_tls.Shutdown();
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

}  // namespace
}  // namespace minions::testing

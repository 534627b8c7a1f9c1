// 40.2d: one credential, or one address, cannot hold every call the server serves at once
// (server/call_caps.h). A call past its cap is refused RESOURCE_EXHAUSTED before its handler does
// anything; others are served; the cap frees as calls end.

#include <thread>

#include "secure_server.h"
#include "server/call_caps.h"

namespace minions::testing {
namespace {

class CallCapAttack : public SecureServer {
 protected:
  void SetUp() override {
    SecureServer::SetUp();
    ServerOptions options = Options();
    options.max_calls_per_credential = 2;
    StartServer(options);
    CreateTeam("search");
    alice_ = Issue(Role::kSubmitter, "search", "alice");
    bob_ = Issue(Role::kViewer, "search", "bob");
  }
  // A WatchJob stream of `token`, held open: in flight once its first update has arrived. A call
  // that has just ended may still count for a moment after its caller has the answer (the server
  // lets it go after it has sent it), so a stream refused for the cap is opened again.
  struct Held {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::JobProgress>> reader;
  };
  Held Watch(const std::string& token, const std::string& job_id) {
    for (int attempt = 0;; ++attempt) {
      Held held{As(token), nullptr};
      held.context->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
      v1::WatchJobRequest request;
      request.set_job_id(job_id);
      request.set_interval_ms(100);  // a cancelled stream ends within one interval
      held.reader = jobs_->WatchJob(held.context.get(), request);
      v1::JobProgress first;
      if (held.reader->Read(&first)) return held;
      grpc::Status status = held.reader->Finish();
      if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED || attempt >= 500) {
        ADD_FAILURE() << "WatchJob: " << status.error_message();
        return held;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  grpc::Status List(const std::string& token) {
    v1::ListJobsResponse listed;
    return jobs_->ListJobs(As(token).get(), v1::ListJobsRequest(), &listed);
  }
  std::string alice_, bob_;
};

TEST_F(CallCapAttack, OneCredentialCannotHoldEveryCall) {
  v1::Job job = MustSubmit(alice_, 2);
  Held one = Watch(alice_, job.id());
  Held two = Watch(alice_, job.id());
  // Alice's third call at once is refused, saying why; a refusal holds nothing.
  for (int i = 0; i < 3; ++i) {
    grpc::Status refused = List(alice_);
    EXPECT_GRPC_CODE(refused, RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.error_message(), HasSubstr("with one credential"));
  }
  // Another credential is served; no credential is still refused as before, by the gate.
  ASSERT_GRPC_OK(List(bob_));
  EXPECT_GRPC_CODE(List(""), UNAUTHENTICATED);
  // One of Alice's calls ends: she is served again (once the server has seen it end).
  one.context->TryCancel();
  one.reader->Finish();
  grpc::Status again = List(alice_);
  for (int i = 0; i < 500 && again.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    again = List(alice_);
  }
  ASSERT_GRPC_OK(again);
  two.context->TryCancel();
  two.reader->Finish();
}

// A caller cannot refuse others by sending the marker itself, nor get past the cap by it.
TEST_F(CallCapAttack, TheOverCapMarkerIsTheServersOnly) {
  auto context = As(bob_);
  context->AddMetadata(kOverCapHeader, "forged");
  v1::ListJobsResponse listed;
  ASSERT_GRPC_OK(jobs_->ListJobs(context.get(), v1::ListJobsRequest(), &listed));
}

// Per address: each non-loopback address has its own count; loopback and Unix sockets (a pool's
// executors on one machine) are not capped per address; a call past a cap is not counted.
TEST(CallCaps, EachAddressIsCappedButLoopbackIsNot) {
  CallCaps caps(CallCapOptions{.per_peer = 2, .per_credential = 0});
  EXPECT_EQ(caps.Admit("ipv4:10.0.0.5:1000", "a"), "");
  EXPECT_EQ(caps.Admit("ipv4:10.0.0.5:1001", "b"), "");
  EXPECT_EQ(caps.Admit("ipv4:10.0.0.5:1002", "c"), "peer");
  EXPECT_EQ(caps.FromPeer("ipv4:10.0.0.5:9"), 2);
  EXPECT_EQ(caps.Admit("ipv4:10.0.0.6:1000", "c"), "");
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(caps.Admit("ipv4:127.0.0.1:1000", "d"), "");
    EXPECT_EQ(caps.Admit("ipv6:[::1]:1000", "d"), "");
    EXPECT_EQ(caps.Admit("unix:/tmp/s", "d"), "");
  }
  EXPECT_EQ(caps.Admit("ipv6:[2001:db8::1]:1000", "e"), "");
  EXPECT_EQ(caps.Admit("ipv6:%5B2001:db8::1%5D:1001", "e"), "");
  EXPECT_EQ(caps.Admit("ipv6:[2001:db8::1]:1002", "e"), "peer");
  caps.Ended("ipv4:10.0.0.5:1000", "a");
  EXPECT_EQ(caps.Admit("ipv4:10.0.0.5:1003", "c"), "");
  EXPECT_EQ(PeerAddress("ipv4:10.0.0.5:1000"), "ipv4:10.0.0.5");
  EXPECT_EQ(PeerAddress("ipv4:127.9.9.9:1"), "");
}

TEST(CallCaps, EachCredentialIsCappedWhereverItCallsFrom) {
  CallCaps caps(CallCapOptions{.per_peer = 0, .per_credential = 1});
  EXPECT_EQ(caps.Admit("ipv4:10.0.0.5:1000", "token"), "");
  EXPECT_EQ(caps.Admit("ipv4:10.0.0.9:1000", "token"), "credential");
  EXPECT_EQ(caps.Admit("ipv4:127.0.0.1:1000", "token"), "credential");
  EXPECT_EQ(caps.Admit("ipv4:10.0.0.5:1001", "other"), "");
  EXPECT_EQ(caps.WithCredential("token"), 1);
  caps.Ended("ipv4:10.0.0.5:1000", "token");
  EXPECT_EQ(caps.WithCredential("token"), 0);
  EXPECT_EQ(caps.Admit("ipv4:127.0.0.1:1000", "token"), "");
}

}  // namespace
}  // namespace minions::testing

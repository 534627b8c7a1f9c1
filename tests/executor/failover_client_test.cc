// FailoverControlPlaneClient on fake clients and a fake clock: a server that answers (even with
// an error) is kept; one that answers nothing but UNAVAILABLE for give_up_after is left for the
// next address, where the executor registers again before the call is tried there.

#include "executor/failover_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "testing/fake_clock.h"

namespace minions {
namespace {

// One server's side: answers every call with `answer`, counting them.
class FakeServer : public ControlPlaneClient {
 public:
  absl::Status answer;
  int calls = 0;
  std::vector<std::string> registered;  // the names registered here

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override {
    ++calls;
    if (!answer.ok()) return answer;
    registered.push_back(request.capabilities().name());
    return v1::RegisterResponse();
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest&) override {
    ++calls;
    if (!answer.ok()) return answer;
    return v1::HeartbeatResponse();
  }
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest&) override {
    ++calls;
    if (!answer.ok()) return answer;
    return v1::LeaseResponse();
  }
  absl::Status Complete(const v1::CompleteRequest&) override { return ++calls, answer; }
  absl::StatusOr<v1::CompleteBatchResponse> CompleteBatch(const v1::CompleteBatchRequest&) override {
    ++calls;
    if (!answer.ok()) return answer;
    return v1::CompleteBatchResponse();
  }
  absl::Status Fail(const v1::FailRequest&) override { return ++calls, answer; }
};

// A client that forwards to a FakeServer the test keeps (the failover client owns its clients).
class Forward : public ControlPlaneClient {
 public:
  explicit Forward(FakeServer* to) : to_(to) {}
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& r) override { return to_->Register(r); }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& r) override { return to_->Heartbeat(r); }
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& r) override { return to_->Lease(r); }
  absl::Status Complete(const v1::CompleteRequest& r) override { return to_->Complete(r); }
  absl::StatusOr<v1::CompleteBatchResponse> CompleteBatch(const v1::CompleteBatchRequest& r) override {
    return to_->CompleteBatch(r);
  }
  absl::Status Fail(const v1::FailRequest& r) override { return to_->Fail(r); }

 private:
  FakeServer* to_;
};

class FailoverTest : public ::testing::Test {
 protected:
  std::unique_ptr<FailoverControlPlaneClient> Make(std::vector<std::string> addresses) {
    return std::make_unique<FailoverControlPlaneClient>(
        std::move(addresses),
        [this](const std::string& address) -> absl::StatusOr<std::unique_ptr<ControlPlaneClient>> {
          opened_.push_back(address);
          if (!servers_.count(address)) return absl::InvalidArgumentError("no such address");
          return std::make_unique<Forward>(&servers_[address]);
        },
        &clock_, absl::Seconds(5));
  }
  static v1::RegisterRequest Registration(const std::string& name) {
    v1::RegisterRequest r;
    r.mutable_capabilities()->set_name(name);
    return r;
  }

  testing::FakeClock clock_;
  std::map<std::string, FakeServer> servers_;
  std::vector<std::string> opened_;
};

TEST_F(FailoverTest, AServerGoneForGoodIsLeftForTheNextWhereTheExecutorRegistersAgain) {
  servers_["a:1"];
  servers_["b:2"];
  auto client = Make({"a:1", "b:2"});
  ASSERT_TRUE(client->Register(Registration("e1")).ok());
  EXPECT_EQ(opened_, std::vector<std::string>{"a:1"}) << "the next is opened only when needed";
  servers_["a:1"].answer = absl::UnavailableError("connection refused");
  // A blip: within give_up_after the executor stays (the agent retries).
  EXPECT_TRUE(absl::IsUnavailable(client->Heartbeat({}).status()));
  clock_.Advance(absl::Seconds(4));
  EXPECT_TRUE(absl::IsUnavailable(client->Lease({}).status()));
  EXPECT_EQ(client->current_address(), "a:1");
  // Gone for 5 s: registered at b with the last registration, and the call answered there.
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(client->Heartbeat({}).ok());
  EXPECT_EQ(client->current_address(), "b:2");
  EXPECT_EQ(servers_["b:2"].registered, std::vector<std::string>{"e1"});
  const int a_calls = servers_["a:1"].calls;
  EXPECT_TRUE(client->Complete({}).ok());
  EXPECT_EQ(servers_["a:1"].calls, a_calls) << "a is not asked again";
}

TEST_F(FailoverTest, AServerThatAnswersIsKeptEvenWithErrors) {
  servers_["a:1"].answer = absl::FailedPreconditionError("lease lost");
  servers_["b:2"];
  auto client = Make({"a:1", "b:2"});
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(absl::IsFailedPrecondition(client->Complete({})));
    clock_.Advance(absl::Seconds(10));
  }
  EXPECT_EQ(client->current_address(), "a:1");
  // An answer between two refusals starts the count again.
  servers_["a:1"].answer = absl::UnavailableError("refused");
  EXPECT_FALSE(client->Heartbeat({}).ok());
  clock_.Advance(absl::Seconds(4));
  servers_["a:1"].answer = absl::OkStatus();
  EXPECT_TRUE(client->Heartbeat({}).ok());
  servers_["a:1"].answer = absl::UnavailableError("refused");
  clock_.Advance(absl::Seconds(2));
  EXPECT_FALSE(client->Heartbeat({}).ok());
  EXPECT_EQ(client->current_address(), "a:1");
}

TEST_F(FailoverTest, AnAddressThatCannotBeOpenedOrRefusesTheExecutorIsSkipped) {
  servers_["a:1"];
  servers_["c:3"];
  auto client = Make({"a:1", "nowhere:2", "c:3"});
  ASSERT_TRUE(client->Register(Registration("e1")).ok());
  servers_["a:1"].answer = absl::UnavailableError("refused");
  EXPECT_FALSE(client->Lease({}).ok());
  clock_.Advance(absl::Seconds(6));
  EXPECT_TRUE(client->Lease({}).ok());
  EXPECT_EQ(client->current_address(), "c:3");
  EXPECT_EQ(servers_["c:3"].registered, std::vector<std::string>{"e1"});
  // With every other server gone too, the executor stays where it is and says so by its errors.
  servers_["c:3"].answer = absl::UnavailableError("refused");
  EXPECT_FALSE(client->Lease({}).ok());
  clock_.Advance(absl::Seconds(6));
  EXPECT_TRUE(absl::IsUnavailable(client->Lease({}).status()));
}

}  // namespace
}  // namespace minions
